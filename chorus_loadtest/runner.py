"""Run the levels: at concurrency c, c simulated users each submit a request,
wait for its end, and take the next, until the level's requests are issued (or
its duration is up). Levels run one after another, so each starts on an empty
queue."""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TextIO

import httpx

from chorus_loadtest.client import Sample, SpeechClient
from chorus_loadtest.options import LoadTestOptions
from chorus_loadtest.sampler import ResourceSampler
from chorus_loadtest.stats import LevelStats, summarize


class LoadTestError(Exception):
    """The run cannot go on (e.g. the warm-up shows the key or URL is wrong)."""


@dataclass
class RunResult:
    options: LoadTestOptions
    started_at: datetime
    levels: list[LevelStats] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def engines(self) -> list[str]:
        return sorted({s.engine for s in self.samples if s.engine})


class Progress:
    """One status line on stderr: redrawn in place on a terminal, else a line per level."""

    def __init__(self, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.live = enabled and self.stream.isatty()
        self._last = 0.0

    def update(
        self, label: str, done: int, target: int | None, failed: int, elapsed: float
    ) -> None:
        if not self.live or time.monotonic() - self._last < 0.2:
            return
        self._last = time.monotonic()
        of = f"/{target}" if target else ""
        line = f"{label}: {done}{of} done, {failed} failed, {elapsed:5.1f} s"
        self.stream.write(f"\r{line:<78}")
        self.stream.flush()

    def finish(self, line: str) -> None:
        if self.enabled:
            self.stream.write(f"\r{line:<78}\n" if self.live else f"{line}\n")
            self.stream.flush()


def run_load_test(
    options: LoadTestOptions, *, progress: Progress | None = None, http: httpx.Client | None = None
) -> RunResult:
    progress = progress or Progress(enabled=options.progress)
    own_client = http is None
    if http is None:
        http = httpx.Client(
            base_url=options.url,
            headers={"Authorization": f"Bearer {options.key}"},
            timeout=httpx.Timeout(min(options.timeout_s, 60.0), connect=10.0),
            limits=httpx.Limits(max_connections=max(options.levels) + 8),
        )
    sampler = ResourceSampler(
        worker_pids=options.worker_pids,
        process_patterns=options.process_patterns,
        interval_s=options.sample_interval_s,
    )
    result = RunResult(options=options, started_at=datetime.now(UTC), notes=sampler.notes)
    client = SpeechClient(http, options)
    began = time.monotonic()
    try:
        _warm_up(client, options, progress)
        for number, concurrency in enumerate(options.levels, start=1):
            label = f"level {number}/{len(options.levels)} (concurrency {concurrency})"
            sampler.start()
            samples = _run_level(client, options, concurrency, label, progress)
            stats = summarize(concurrency, samples, sampler.stop())
            result.samples.extend(samples)
            result.levels.append(stats)
            progress.finish(
                f"{label}: {stats.requests} requests, {stats.failures} failed, {stats.wall_s:.1f} s"
            )
    finally:
        result.wall_s = time.monotonic() - began
        if own_client:
            http.close()
    if options.stream and any(s.ok and not s.streamed for s in result.samples):
        result.notes.append(
            "--stream asked, but the server answered with queued jobs: those requests "
            "were measured by polling"
        )
    return result


def _warm_up(client: SpeechClient, options: LoadTestOptions, progress: Progress) -> None:
    if options.warmup <= 0:
        return
    samples = [client.run(level=0, index=i) for i in range(options.warmup)]
    failed = [s for s in samples if not s.ok]
    if len(failed) == len(samples):
        codes = ", ".join(sorted({s.error_code for s in failed}))
        raise LoadTestError(f"every warm-up request failed ({codes}); check --url and --key")
    progress.finish(f"warm-up: {len(samples)} requests, {len(failed)} failed (not counted)")


def _run_level(
    client: SpeechClient,
    options: LoadTestOptions,
    concurrency: int,
    label: str,
    progress: Progress,
) -> list[Sample]:
    lock = threading.Lock()
    samples: list[Sample] = []
    issued = 0
    start = time.monotonic()
    target = None if options.duration_s is not None else options.repetitions

    def next_index() -> int | None:
        nonlocal issued
        with lock:
            if options.duration_s is not None:
                if time.monotonic() - start >= options.duration_s:
                    return None
            elif issued >= options.repetitions:
                return None
            issued += 1
            return issued - 1

    def user() -> None:
        while (index := next_index()) is not None:
            sample = client.run(level=concurrency, index=index)
            with lock:
                samples.append(sample)
                failed = sum(1 for s in samples if not s.ok)
                progress.update(label, len(samples), target, failed, time.monotonic() - start)

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="loadtest-user") as pool:
        for future in [pool.submit(user) for _ in range(concurrency)]:
            future.result()
    return sorted(samples, key=lambda s: s.index)
