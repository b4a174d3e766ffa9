"""One emulated accelerator shared by every process on the machine, through files.

A device is a name (e.g. "emu0"), a `DeviceProfile` (how it slows down as
streams share it, and its memory) and state in a state folder:

* `<device>.ledger.json` records memory reservations (by pid and id): the model
  of each loaded engine and every active stream, rewritten atomically under an
  `flock` on `<device>.ledger.lock`. Entries of processes that no longer exist
  are dropped on every update, so a killed worker cannot leak emulated memory.
* `<device>.streams` holds the device's clock (`DeviceClock`): the number of
  active streams, when it last changed, and the work one stream had done by
  then. It is rewritten with the ledger and read without a lock.

A stream's work is measured in seconds at one stream; while `n` streams are
active it advances at `1 / profile.slowdown(n)` of that, whether the others
are threads of this process or other processes. That is how a GPU behaves
(several CUDA streams overlap; each runs somewhat slower), not how a mutex
behaves (n users each at 1/n speed), which is what this device did before.
With the clock a stream's work over any span is the difference of two
readings, however many streams came and went between them, so a stream feels
another's start or end at once, not at its next wake-up. A stream starts when it
is asked for, both its own work and its share of the card: the ledger's
bookkeeping (a file lock, a JSON rewrite: about a millisecond, more on a busy
host, and one after another when several start together) is the emulator's, not
the card's, and delays nothing. (Dating a start back to its ask changes the rate
of the moment in between for the streams that read the clock meanwhile: a
stream may end that millisecond times the change in its rate late.)

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
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chorus.errors import EngineOutOfMemory
from chorus.processes import proc_stat, process_alive
from synthesis.engines.device_profiles import DeviceProfile

GiB = 1024**3
# The longest a stream sleeps before it reads the device's clock again. Its work
# is reckoned exactly whatever the quantum; a stream that sleeps while the others
# end wakes up to this late.
QUANTUM_S = 0.025
# The most work a stream may carry past what it was asked for (see `spend`).
MAX_AHEAD_S = 0.5
# How often a long stream prunes the ledger of dead processes, so a killed
# worker's streams stop slowing the survivors even when nothing else changes.
PRUNE_EVERY_S = 1.0

# streams, since, first, rest; then a CRC-32 of those 32 bytes, so a reader that
# raced a rewrite reads again instead of believing half of each.
_CLOCK = struct.Struct("<Qddd")
_CHECK = struct.Struct("<I")
_TORN_READS = 100
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
        self.ledger = MemoryLedger(
            Path(state_dir), self.device, profile.memory_bytes, slowdown=profile.slowdown
        )
        self.quantum_s = quantum_s

    def running_streams(self) -> int:
        return self.ledger.clock().streams

    def work_done(self, *, first: bool) -> tuple[float, DeviceClock]:
        """One stream's work on this device until now (on the first-audio curve
        or the other), and the clock it was read from."""
        clock = self.ledger.clock()
        now = time.monotonic()  # read after the clock: never before its last change
        return clock.work(now, first=first, slowdown=self.profile.slowdown), clock

    @contextmanager
    def stream(self, *, engine: str) -> Iterator[DeviceStream]:
        """Hold one stream's memory for its life; EngineOutOfMemory when it does
        not fit (as CUDA would fail the allocation)."""
        stream_id = f"stream-{uuid.uuid4().hex}"
        clock = self.ledger.clock()
        asked = time.monotonic()
        self.ledger.reserve(
            stream_id, self.profile.stream_bytes, engine=engine, kind="stream", at=asked
        )
        reserved, _ = self.work_done(first=True)
        began = clock.work(asked, first=True, slowdown=self.profile.slowdown)
        try:
            # Only the reservation's time: a text stream may wait for its text
            # before its first spend, and that wait is no work of the card's.
            yield DeviceStream(self, head_start=max(0.0, reserved - began))
        finally:
            self.ledger.release(stream_id)


class DeviceStream:
    """One active stream: spends work at the speed the device gives it."""

    def __init__(self, device: EmulatedDevice, *, head_start: float = 0.0) -> None:
        self.device = device
        self._pruned_at = time.monotonic()
        # First-audio work done while the ledger reserved the stream: its first
        # spend counts it as done (see the module's docstring).
        self._head_start = head_start
        # Work done past what was asked: a sleep that overshot (a busy host wakes
        # a thread late) is taken off the next spend, as a device runs on while
        # the host is late, so a stream's chunks do not each add the host's lag.
        self._ahead = 0.0

    def spend(self, seconds: float, *, first: bool) -> None:
        """Return once `seconds` of one-stream work are done: `first` for the work
        before the stream's first chunk (it follows the first-audio curve)."""
        began, _ = self.device.work_done(first=first)
        if first:
            began -= self._head_start
            self._head_start = 0.0
        target = seconds - self._ahead
        while True:
            work, clock = self.device.work_done(first=first)
            remaining = target - (work - began)
            if remaining <= 1e-6:
                break
            if time.monotonic() - self._pruned_at >= PRUNE_EVERY_S:
                self.device.ledger.usage()  # drops streams of dead processes
                self._pruned_at = time.monotonic()
                continue
            factor = self.device.profile.slowdown(clock.streams, first=first)
            time.sleep(min(self.device.quantum_s, remaining * factor))
        # Bounded: a clock record rebuilt after damage may jump ahead once; that
        # must not make the rest of the stream free.
        self._ahead = min(max(0.0, -remaining), MAX_AHEAD_S)


Slowdown = Callable[..., float]  # DeviceProfile.slowdown: (streams, *, first) -> factor


@dataclass(frozen=True)
class DeviceClock:
    """The device's concurrency since `since` (a `time.monotonic()` time: one
    clock for every process of the machine) and the work one stream had done by
    then on each curve (`first` for the work before a first chunk, `rest` after
    it). Readings only ever matter as differences."""

    streams: int = 0
    since: float = 0.0
    first: float = 0.0
    rest: float = 0.0

    def work(self, now: float, *, first: bool, slowdown: Slowdown) -> float:
        # A `since` ahead of `now` is a clock of an earlier boot: nothing ran since.
        elapsed = max(0.0, now - self.since)
        done = self.first if first else self.rest
        return done + elapsed / slowdown(max(1, self.streams), first=first)

    def changed(self, now: float, streams: int, slowdown: Slowdown) -> DeviceClock:
        """The clock from `now` on, with `streams` streams."""
        return DeviceClock(
            streams=streams,
            since=now,
            first=self.work(now, first=True, slowdown=slowdown),
            rest=self.work(now, first=False, slowdown=slowdown),
        )

    def pack(self) -> bytes:
        body = _CLOCK.pack(self.streams, self.since, self.first, self.rest)
        return body + _CHECK.pack(zlib.crc32(body))

    @classmethod
    def unpack(cls, raw: bytes) -> DeviceClock | None:
        """The clock, or None for a torn or damaged record."""
        if len(raw) != _CLOCK.size + _CHECK.size:
            return None
        body = raw[: _CLOCK.size]
        if _CHECK.unpack(raw[_CLOCK.size :])[0] != zlib.crc32(body):
            return None
        return cls(*_CLOCK.unpack(body))


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

    def __init__(
        self,
        state_dir: Path,
        device: str,
        capacity_bytes: int,
        *,
        slowdown: Slowdown,
    ) -> None:
        self.device = check_device_name(device)
        self.capacity_bytes = capacity_bytes
        self.slowdown = slowdown  # the card's curve, which the clock runs at
        self.path = Path(state_dir) / f"{device}.ledger.json"
        self.lock_path = Path(state_dir) / f"{device}.ledger.lock"
        self.streams_path = Path(state_dir) / f"{device}.streams"

    def reserve(
        self,
        instance_id: str,
        nbytes: int,
        *,
        engine: str,
        kind: str = "model",
        at: float | None = None,
    ) -> None:
        """Reserve `nbytes` for this process's `instance_id` (a model or a stream),
        or raise EngineOutOfMemory. The device's clock counts it from `at` (when
        it was asked for), not from when the ledger got to it."""
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

        self._update(change, at=at)

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

    def clock(self) -> DeviceClock:
        """The device's clock as of the last ledger update (no lock)."""
        try:
            fd = os.open(self.streams_path, os.O_RDONLY)
        except FileNotFoundError:
            return DeviceClock()
        try:
            for _ in range(_TORN_READS):
                clock = DeviceClock.unpack(os.pread(fd, _CLOCK.size + _CHECK.size, 0))
                if clock is not None:
                    return clock
            # Damaged, not torn: a fresh clock; the next update rewrites it from
            # there (a stream reading across that may end one spend early).
            return DeviceClock()
        finally:
            os.close(fd)

    def _update(self, change: Callable[[Reservations], object], *, at: float | None = None) -> None:
        with _flocked(self.lock_path):
            reservations = {
                key: entry for key, entry in self._read().items() if _entry_alive(entry)
            }
            try:
                change(reservations)
            finally:
                # Written even when `change` refuses, so pruning is never lost.
                self._write(reservations, at=at)

    def _read(self) -> Reservations:
        try:
            document = json.loads(self.path.read_text())
            reservations = document["reservations"]
        except (OSError, ValueError, KeyError, TypeError):
            return {}  # missing or damaged: start over (live processes re-register on load)
        return reservations if isinstance(reservations, dict) else {}

    def _write(self, reservations: Reservations, *, at: float | None = None) -> None:
        document = {"device": self.device, "reservations": reservations}
        temporary = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(document, indent=1, sort_keys=True))
        os.replace(temporary, self.path)  # readers never see a half-written file
        streams = sum(1 for entry in reservations.values() if entry.get("kind") == "stream")
        clock = self.clock()
        now = time.monotonic()
        # Back to `at`, never before the clock's last change (what was read
        # from it stays true up to that change).
        since = now if at is None else min(now, max(at, clock.since))
        clock = clock.changed(since, streams, self.slowdown)
        fd = os.open(self.streams_path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            os.pwrite(fd, clock.pack(), 0)
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
