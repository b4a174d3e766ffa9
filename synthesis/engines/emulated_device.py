"""One emulated accelerator shared by every process on the machine, through files.

A device is a name (e.g. "emu0") and two kinds of state in a state folder:

* `<device>.lock` is the device itself: code "computes" only while holding an
  exclusive `flock` on it, in short slices, so concurrent users time-share it.
  `flock` locks belong to open file descriptions, so threads that each open the
  file exclude one another exactly as separate processes do.
* `<device>.ledger.json` records memory reservations (by pid and instance),
  rewritten atomically under an `flock` on `<device>.ledger.lock`. Entries of
  processes that no longer exist are dropped on every update, so a killed worker
  cannot leak emulated memory.

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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chorus.errors import EngineOutOfMemory

GiB = 1024**3
# Longest time one holder keeps the device before letting others in.
QUANTUM_S = 0.01
# Pause between slices so a waiting process can win the lock (flock is not a fair
# queue: without it the releasing process would usually re-take the lock at once).
HANDOFF_S = 0.0005

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


class DeviceClock:
    """Spends device time: sleeps only while holding the device lock."""

    def __init__(self, state_dir: Path, device: str, quantum_s: float = QUANTUM_S) -> None:
        self.path = Path(state_dir) / f"{check_device_name(device)}.lock"
        self.quantum_s = quantum_s

    def spend(self, seconds: float) -> None:
        """Return once `seconds` of exclusive device time have been spent."""
        if seconds <= 0:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            self._spend(fd, seconds)
        finally:
            os.close(fd)

    def _spend(self, fd: int, remaining: float) -> None:
        # The lock file holds a grant counter that every holder increments. If it
        # still shows our own last grant when we re-acquire, nobody else used the
        # device during our hand-off pause, so that pause counts as our time too:
        # a lone user runs at full speed, and only real contention slows anyone.
        our_grant: int | None = None
        released_at = 0.0
        while remaining > 0:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                acquired = time.monotonic()
                grant = _read_counter(fd)
                if grant == our_grant:
                    remaining -= acquired - released_at
                our_grant = (grant + 1) % 2**64
                os.pwrite(fd, _COUNTER.pack(our_grant), 0)
                if remaining > 0:
                    time.sleep(min(self.quantum_s, remaining))
                released_at = time.monotonic()
                remaining -= released_at - acquired
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            if remaining > 0:
                time.sleep(HANDOFF_S)


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

    def reserve(self, instance_id: str, nbytes: int, *, engine: str) -> None:
        """Reserve `nbytes` for this process's `instance_id`, or raise EngineOutOfMemory."""
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


def _used(reservations: Reservations) -> int:
    return sum(int(entry.get("bytes", 0)) for entry in reservations.values())


def _gib(nbytes: int) -> str:
    return f"{nbytes / GiB:.1f} GiB"


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, start time) from /proc, or None where /proc is unavailable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces; everything after its ")" is fixed.
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0], fields[19]


def _process_start(pid: int) -> str | None:
    stat = _proc_stat(pid)
    return stat[1] if stat else None


def _entry_alive(entry: Any) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("pid"), int):
        return False
    pid: int = entry["pid"]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    stat = _proc_stat(pid)
    if stat is None:
        return True
    state, started = stat
    if state in ("Z", "X"):
        return False  # exited, not yet reaped by its parent
    # A different start time means the pid was reused by an unrelated process.
    return entry.get("started") in (None, started)
