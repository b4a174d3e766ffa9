"""Each worker process reports itself every few seconds; the admin lists them.

A row per worker process in the database (not Redis): the admin shows it with
no extra machinery, and a write every ten seconds per worker costs nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from datetime import datetime

import psutil
from django.db import connection
from django.utils import timezone

from chorus.db import recycle_connections
from synthesis.engines.base import EngineInfo
from synthesis.models import WorkerHeartbeat
from synthesis.stream_limits import StreamLimits

log = logging.getLogger(__name__)

INTERVAL_S = 2.0
# A worker not seen for this long is gone: its running jobs go back to their
# queues (`synthesis.services.recovery`). Several missed beats, so a busy
# database does not make a live worker look dead.
LOST_AFTER_S = 5 * INTERVAL_S
# After a failed beat (the database restarting, say) the next comes sooner: the
# first beat after the database's return should not wait out a whole interval,
# or a short outage could make this worker look lost to the sweeper.
RETRY_S = 0.5


def worker_is_alive(seen_at: datetime, now: datetime) -> bool:
    return (now - seen_at).total_seconds() < LOST_AFTER_S


class Heartbeat:
    def __init__(
        self,
        *,
        name: str,
        info: EngineInfo,
        slots: int = 1,
        limits: StreamLimits | None = None,
        node: str = "",
        queues: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.info = info
        self.slots = slots
        # What a waiting job of each priority can count on (queue estimates).
        self.limits = limits or StreamLimits(low=slots, normal=slots, high=slots)
        self.node = node
        self.queues = ",".join(queues)
        self.started_at = timezone.now()
        self._process = psutil.Process()
        self.busy = 0
        self.done = 0
        self.failed = 0
        self.last_error = ""
        # Set once, on SIGTERM (`synthesis.drain`): readiness fails and queue
        # estimates stop counting this worker's streams.
        self.draining_since: datetime | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()

    @contextlib.contextmanager
    def working(self) -> Iterator[None]:
        with self._lock:
            self.busy += 1
        try:
            yield
        finally:
            with self._lock:
                self.busy -= 1

    def record(self, *, status: str, error: str = "") -> None:
        with self._lock:
            self.done += int(status == "succeeded")
            self.failed += int(status == "failed")
            if error:
                self.last_error = error

    def beat(self) -> None:
        with self._lock:
            values = {
                "engine": self.info.name,
                "device": self.info.device,
                "memory_bytes": self.info.memory_bytes,
                "rss_bytes": self._process.memory_info().rss,
                "node": self.node,
                "queues": self.queues,
                "slots": self.slots,
                "streams_normal": min(self.limits.normal, self.slots),
                "streams_low": min(self.limits.low, self.slots),
                "slots_busy": self.busy,
                "jobs_done": self.done,
                "jobs_failed": self.failed,
                "last_error": self.last_error,
                "started_at": self.started_at,
                "draining_since": self.draining_since,
                "seen_at": timezone.now(),
            }
        # One UPDATE in the common case (update_or_create is a locking read and an
        # UPDATE in a transaction: four round trips every beat); the row is made
        # by the first beat, or again if the admin deleted it.
        if not WorkerHeartbeat.objects.filter(name=self.name).update(**values):
            WorkerHeartbeat.objects.update_or_create(name=self.name, defaults=values)

    def drain(self) -> None:
        """Say at once, not at the next beat, that this worker takes no new jobs."""
        with self._lock:
            if self.draining_since is None:
                self.draining_since = timezone.now()
        self.beat()

    def start(self) -> None:
        threading.Thread(target=self._run, name="heartbeat", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                recycle_connections()
                self.beat()
                wait = INTERVAL_S
            except Exception:  # a missed beat is not worth stopping the worker for
                log.warning("heartbeat failed", exc_info=True)
                # Dropped at once: checking a dead connection's health first is
                # one more round trip that may never be answered.
                connection.close()
                wait = RETRY_S
            self._stop.wait(wait)


def report_failed_start(*, name: str, engine: str, error: str) -> None:
    """Leave a trace in the admin of a worker that could not load its engine."""
    now = timezone.now()
    with contextlib.suppress(Exception):
        WorkerHeartbeat.objects.update_or_create(
            name=name,
            defaults={
                "engine": engine,
                "device": "-",
                "slots_busy": 0,
                "last_error": f"engine failed to load: {error}"[:2000],
                "started_at": now,
                "seen_at": now,
            },
        )
