"""One emulated accelerator shared by every process on the machine, through files.

A device is a name (e.g. "emu0"), a `DeviceProfile` (how it slows down as
streams share it, and its memory) and state in a state folder:

* `<device>.ledger.json` records memory reservations (by pid and id): the model
  of each loaded engine and every active stream, rewritten atomically under an
  `flock` on `<device>.ledger.lock`. Entries of processes that no longer exist
  are dropped on every update, so a killed worker cannot leak emulated memory.
* `<device>.streams` holds the number of active streams (8 bytes), rewritten
  with the ledger, so a stream can read how many share the device without
  taking a lock.

A stream's work is measured in seconds at one stream; while `n` streams are
active it advances at `1 / profile.slowdown(n)` of that, whether the others
are threads of this process or other processes. That is how a GPU behaves
(several CUDA streams overlap; each runs somewhat slower), not how a mutex
behaves (n users each at 1/n speed), which is what this device did before.

Pid liveness is judged in this machine's pid namespace: processes sharing a
state folder must share a pid namespace (a default per-container /tmp does).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chorus.errors import EngineOutOfMemory
from chorus.processes import proc_stat, process_alive
from synthesis.engines.device_profiles import DeviceProfile

GiB = 1024**3
# How often a stream re-reads how many streams share the device. A change of
# concurrency is felt at most this late; 25 ms is under 2 % of a first chunk.
QUANTUM_S = 0.025
# How often a long stream prunes the ledger of dead processes, so a killed
# worker's streams stop slowing the survivors even when nothing else changes.
PRUNE_EVERY_S = 1.0

_COUNTER = struct.Struct("<Q")
_DEVICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_device_name(device: str) -> str:
    """Device names become file names, so only a safe alphabet is allowed."""
    if not _DEVICE_NAME.fullmatch(device):
        raise ValueError(f"invalid emulated device name {device!r}")
    return device


@contextmanager
def _flocked(path: Path) -> Iterator[int]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)  # closing the descriptor also releases its lock


class EmulatedDevice:
    """Streams on one emulated card: memory per stream and the profile's curve."""

    def __init__(
        self,
        state_dir: Path,
        device: str,
        profile: DeviceProfile,
        quantum_s: float = QUANTUM_S,
    ) -> None:
        self.device = check_device_name(device)
        self.profile = profile
        self.ledger = MemoryLedger(Path(state_dir), self.device, profile.memory_bytes)
        self.quantum_s = quantum_s

    def running_streams(self) -> int:
        return self.ledger.streams()

    @contextmanager
    def stream(self, *, engine: str) -> Iterator[DeviceStream]:
        """Hold one stream's memory for its life; EngineOutOfMemory when it does
        not fit (as CUDA would fail the allocation)."""
        stream_id = f"stream-{uuid.uuid4().hex}"
        self.ledger.reserve(stream_id, self.profile.stream_bytes, engine=engine, kind="stream")
        try:
            yield DeviceStream(self)
        finally:
            self.ledger.release(stream_id)


class DeviceStream:
    """One active stream: spends work at the speed the device gives it now."""

    def __init__(self, device: EmulatedDevice) -> None:
        self.device = device
        self._pruned_at = time.monotonic()
        # Work done past what was asked: a sleep that overshot (a busy host wakes
        # a thread late) is taken off the next spend, as a device runs on while
        # the host is late, so a stream's chunks do not each add the host's lag.
        self._ahead = 0.0

    def spend(self, seconds: float, *, first: bool) -> None:
        """Return once `seconds` of one-stream work are done: `first` for the work
        before the stream's first chunk (it follows the first-audio curve)."""
        remaining = seconds - self._ahead
        now = time.monotonic()
        while remaining > 1e-6:
            if now - self._pruned_at >= PRUNE_EVERY_S:
                self.device.ledger.usage()  # drops streams of dead processes
                self._pruned_at = now
            factor = self.device.profile.slowdown(self.device.running_streams(), first=first)
            time.sleep(min(self.device.quantum_s, remaining * factor))
            later = time.monotonic()
            remaining -= (later - now) / factor
            now = later
        self._ahead = max(0.0, -remaining)


def _read_counter(fd: int) -> int:
    raw = os.pread(fd, _COUNTER.size, 0)
    return _COUNTER.unpack(raw)[0] if len(raw) == _COUNTER.size else 0


@dataclass(frozen=True)
class MemoryUsage:
    device: str
    capacity_bytes: int
    used_bytes: int
    reservations: dict[str, dict[str, Any]]

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes


Reservations = dict[str, dict[str, Any]]


class MemoryLedger:
    """Per-device memory reservations shared by all processes through a JSON file."""

    def __init__(self, state_dir: Path, device: str, capacity_bytes: int) -> None:
        self.device = check_device_name(device)
        self.capacity_bytes = capacity_bytes
        self.path = Path(state_dir) / f"{device}.ledger.json"
        self.lock_path = Path(state_dir) / f"{device}.ledger.lock"
        self.streams_path = Path(state_dir) / f"{device}.streams"

    def reserve(self, instance_id: str, nbytes: int, *, engine: str, kind: str = "model") -> None:
        """Reserve `nbytes` for this process's `instance_id` (a model or a stream),
        or raise EngineOutOfMemory."""
        pid = os.getpid()

        def change(reservations: Reservations) -> None:
            free = self.capacity_bytes - _used(reservations)
            if nbytes > free:
                raise EngineOutOfMemory(
                    f"emulated GPU {self.device} out of memory: {_gib(nbytes)} requested, "
                    f"{_gib(max(free, 0))} free of {_gib(self.capacity_bytes)}",
                    details={
                        "device": self.device,
                        "requested_bytes": nbytes,
                        "free_bytes": max(free, 0),
                        "capacity_bytes": self.capacity_bytes,
                    },
                )
            reservations[f"{pid}:{instance_id}"] = {
                "pid": pid,
                "started": _process_start(pid),
                "bytes": nbytes,
                "engine": engine,
                "kind": kind,
                "reserved_at": round(time.time(), 3),
            }

        self._update(change)

    def release(self, instance_id: str) -> None:
        key = f"{os.getpid()}:{instance_id}"
        self._update(lambda reservations: reservations.pop(key, None))

    def usage(self) -> MemoryUsage:
        """A snapshot after pruning dead processes."""
        snapshot: Reservations = {}
        self._update(snapshot.update)
        return MemoryUsage(self.device, self.capacity_bytes, _used(snapshot), snapshot)

    def used_bytes(self) -> int:
        """Memory reserved now, as of the last ledger update (no lock, no pruning):
        cheap enough to sample every few milliseconds."""
        return _used(self._read())

    def streams(self) -> int:
        """Active streams on the device, as of the last ledger update (no lock)."""
        try:
            fd = os.open(self.streams_path, os.O_RDONLY)
        except FileNotFoundError:
            return 0
        try:
            return _read_counter(fd)
        finally:
            os.close(fd)

    def _update(self, change: Callable[[Reservations], object]) -> None:
        with _flocked(self.lock_path):
            reservations = {
                key: entry for key, entry in self._read().items() if _entry_alive(entry)
            }
            try:
                change(reservations)
            finally:
                # Written even when `change` refuses, so pruning is never lost.
                self._write(reservations)

    def _read(self) -> Reservations:
        try:
            document = json.loads(self.path.read_text())
            reservations = document["reservations"]
        except (OSError, ValueError, KeyError, TypeError):
            return {}  # missing or damaged: start over (live processes re-register on load)
        return reservations if isinstance(reservations, dict) else {}

    def _write(self, reservations: Reservations) -> None:
        document = {"device": self.device, "reservations": reservations}
        temporary = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(document, indent=1, sort_keys=True))
        os.replace(temporary, self.path)  # readers never see a half-written file
        streams = sum(1 for entry in reservations.values() if entry.get("kind") == "stream")
        # One aligned 8-byte write: a lock-free reader sees the old or the new count.
        fd = os.open(self.streams_path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            os.pwrite(fd, _COUNTER.pack(streams), 0)
        finally:
            os.close(fd)


def _used(reservations: Reservations) -> int:
    return sum(int(entry.get("bytes", 0)) for entry in reservations.values())


def _gib(nbytes: int) -> str:
    return f"{nbytes / GiB:.1f} GiB"


def _process_start(pid: int) -> str | None:
    stat = proc_stat(pid)
    return stat[1] if stat else None


def _entry_alive(entry: Any) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("pid"), int):
        return False
    # A different start time means the pid was reused by an unrelated process.
    return process_alive(entry["pid"], started=entry.get("started"))
