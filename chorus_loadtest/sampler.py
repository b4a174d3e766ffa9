"""Resource samples taken while a level runs: worker memory and GPU.

The load test talks to the deployment over HTTP only, so it can see worker
processes only when they run on this machine: named by pid (`--worker-pid`) or
by a substring of their command line (`--sample-processes celery`), children
included. GPU memory and utilization come from NVML (`nvidia-ml-py`, imported
lazily); without it, or without a GPU, those columns stay empty and `notes`
says why.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

import psutil

MiB = 1024 * 1024


@dataclass
class ResourceSummary:
    samples: int = 0
    rss_peak_bytes: int | None = None
    gpu_memory_peak_bytes: int | None = None
    gpu_util_mean_pct: float | None = None
    gpu_util_peak_pct: float | None = None


@dataclass
class ResourceSampler:
    worker_pids: tuple[int, ...] = ()
    process_patterns: tuple[str, ...] = ()
    interval_s: float = 0.5
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rss: list[int] = []
        self._gpu_memory: list[int] = []
        self._gpu_util: list[float] = []
        self._open_nvml()
        if not (self.worker_pids or self.process_patterns):
            self.notes.append(
                "worker memory not sampled (no --worker-pid or --sample-processes given)"
            )

    def _open_nvml(self) -> None:
        try:
            import pynvml  # type: ignore[import-not-found]  # from nvidia-ml-py, optional
        except ImportError:
            self.notes.append("GPU not sampled: nvidia-ml-py is not installed")
            return
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except pynvml.NVMLError as exc:
            self.notes.append(f"GPU not sampled: NVML unavailable ({exc})")
            return
        if not self._handles:
            self.notes.append("GPU not sampled: NVML sees no GPU")
            return
        self._nvml = pynvml

    def start(self) -> None:
        self._rss, self._gpu_memory, self._gpu_util = [], [], []
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="loadtest-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> ResourceSummary:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample_once()  # at least one sample even for a very short level
        return ResourceSummary(
            samples=max(len(self._rss), len(self._gpu_memory)),
            rss_peak_bytes=max(self._rss) if self._rss else None,
            gpu_memory_peak_bytes=max(self._gpu_memory) if self._gpu_memory else None,
            gpu_util_mean_pct=sum(self._gpu_util) / len(self._gpu_util) if self._gpu_util else None,
            gpu_util_peak_pct=max(self._gpu_util) if self._gpu_util else None,
        )

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample_once()

    def sample_once(self) -> None:
        if self.worker_pids or self.process_patterns:
            self._rss.append(sum(_rss(p) for p in self._processes()))
        if self._nvml is not None:
            memory, util = 0, 0.0
            for handle in self._handles:
                memory += int(self._nvml.nvmlDeviceGetMemoryInfo(handle).used)
                util = max(util, float(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            self._gpu_memory.append(memory)
            self._gpu_util.append(util)

    def _processes(self) -> list[psutil.Process]:
        found: dict[int, psutil.Process] = {}
        roots: list[psutil.Process] = []
        for pid in self.worker_pids:
            try:
                roots.append(psutil.Process(pid))
            except psutil.Error:
                continue
        if self.process_patterns:
            for process in psutil.process_iter(["cmdline"]):
                if process.pid == os.getpid():  # our own command line names the pattern
                    continue
                cmdline = " ".join(process.info.get("cmdline") or [])
                if any(pattern in cmdline for pattern in self.process_patterns):
                    roots.append(process)
        for root in roots:
            found[root.pid] = root
            try:
                for child in root.children(recursive=True):
                    found[child.pid] = child
            except psutil.Error:
                continue
        return list(found.values())


def _rss(process: psutil.Process) -> int:
    try:
        return int(process.memory_info().rss)
    except psutil.Error:
        return 0
