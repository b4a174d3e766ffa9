"""Stream admission by priority: a worker takes from the broker only what it can
start at once, and keeps room for `high` work however much `low` work waits.

Celery's task consumer takes messages with BRPOP over the worker's queues in
strict priority order, up to its prefetch (the `high` stream limit, one thread
each). kombu asks the channel's queue cycle which queues each BRPOP names; the
broker's `queue_order_strategy` option makes that cycle `AdmittedQueues`, kombu's
priority order narrowed to the queues still admitted:
with `n` jobs taken and not finished, `synth.low` is asked only while `n < low`,
`synth.normal` while `n < normal`, `synth.high` while `n < high`. Only one BRPOP
of the channel is ever pending, and only a job's end lowers `n`, so a message
is never taken that cannot start at once. `n` is the worker's own count of the
requests it holds (Celery's `worker.state.reserved_requests`), not the channel's
unacknowledged messages: after a broker reconnect the new channel starts at
zero while the old channel's jobs still run.

Why not separate consumers per lane: kombu's virtual transports route a queue's
messages to one callback per connection, so two channels of one connection
consuming one queue would count each other's messages.

A narrowed BRPOP waits briefly. kombu keeps one BRPOP pending per channel and
cannot widen it: with the `normal` streams full, the pending BRPOP asks for
`synth.high` only, and a `normal` message pushed after a `normal` job ended sat
unseen until that BRPOP timed out, a second later. A tenant's backlog hit this on
every job its claim released (the refill publishes the next one while the worker
is full): 100 jobs of a few milliseconds each took 21 s, with 19 stalls of ~1 s
(`bench/worker_overhead.py`, the jobs' start and end times). So while some queue
is left out, the BRPOP times out after `NARROW_BRPOP_TIMEOUT_S` and is asked
again with what is admitted then (`chorus.kombu_overrides`); with every queue
admitted it waits the usual second, and with none there is no BRPOP at all.

Realtime sessions: a session speaks as fast as it is listened to, for as long
as it lasts, so its card must keep up with real time the whole while. `high` is
what memory holds, past the `normal` count that keeps first audio within its
bound and, on the shipped cards, each stream within real time: on a T4, each of
5 streams makes a second of audio in 0.94 s, each of 6 in 1.13 s, so with 7 at
once every session stutters. So while this worker runs a realtime session,
`synth.high` is asked only while `n < normal`, like `synth.normal`: sessions
beyond the `normal` count wait in the broker for a stream (their client waits
for its first audio) rather than all of them stuttering, and `high` jobs do not
join a card a session speaks on beyond that count. A session is known as one
once claimed, so a stream taken just before the claim can still be one more,
until one of them ends.

Waiting for a slot: Celery acknowledges a finished job on its event loop, and
the pool thread that finished it wakes the loop (kombu's hub has a waker for
callbacks scheduled from other threads), so a freed stream takes its next job
at once (measured: 6-20 ms from one job's end to the next one's start on a
one-stream worker). A 50 ms tick did that before; waking the loop 20 times a
second was most of an idle worker's CPU.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from celery import bootsteps
from celery.worker import state as worker_state
from kombu.utils.scheduling import priority_cycle

if TYPE_CHECKING:
    from synthesis.stream_limits import StreamLimits

log = logging.getLogger(__name__)

# How long a BRPOP that leaves out some of the worker's queues waits (Redis 6
# and later take fractions of a second): how late a freed stream sees a message
# of a queue that was left out. While it lasts, a BRPOP every 50 ms.
NARROW_BRPOP_TIMEOUT_S = 0.05
# The broker's `queue_order_strategy` (kombu builds one cycle per channel from
# it, in every process: this module stays light to import for the web tier).
QUEUE_ORDER_STRATEGY = "synthesis.lanes:AdmittedQueues"


class AdmittedQueues(priority_cycle):
    """kombu's priority order, leaving out queues not admitted right now: by
    default, those this worker's stream limits do not admit (none where the
    process has no limits: the web tier, a light worker, a prefork child)."""

    def __init__(
        self, items: list[str] | None = None, admitted: Callable[[str], bool] | None = None
    ) -> None:
        super().__init__(items)
        self.admitted = admitted or admitted_by_stream_limits

    def consume(self, n: int) -> list[str]:  # type: ignore[override]  # kombu returns a list too
        items: list[str] = self.items or []
        return [queue for queue in items[:n] if self.admitted(queue)]

    def brpop_timeout(self, n: int) -> float | None:
        """A short timeout while some of the first `n` queues are left out (a
        queue admitted again must not wait for the pending BRPOP to end); None:
        the channel's own."""
        asked, all_of_them = self.consume(n), (self.items or [])[:n]
        return NARROW_BRPOP_TIMEOUT_S if 0 < len(asked) < len(all_of_them) else None


def admitted_by_stream_limits(queue: str) -> bool:
    limits = _limits()
    if limits is None:
        return True
    taken = len(worker_state.reserved_requests)  # received, not yet finished
    high = limits.normal if realtime_sessions.count() else limits.high
    by_queue = {"synth.high": high, "synth.normal": limits.normal}
    return taken < by_queue.get(queue, limits.low)


class RealtimeSessions:
    """How many realtime sessions this worker process is running now."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0

    def count(self) -> int:
        return self._running

    @contextmanager
    def running(self) -> Iterator[None]:
        """Counts one session for as long as the block runs."""
        with self._lock:
            self._running += 1
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1


realtime_sessions = RealtimeSessions()


class PriorityLanes(bootsteps.StartStopStep):
    """Says at start what the lanes admit (the admitting is `AdmittedQueues`)."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, parent: Any) -> None:
        limits = _limits()
        if limits is None:
            return
        if parent.connection.transport.driver_type != "redis":
            log.warning("stream admission by priority needs the Redis broker; not applied")
            return
        log.info(
            "streams at once: low %d, normal %d, high %d; %d while a realtime session runs (%s)",
            limits.low,
            limits.normal,
            limits.high,
            limits.normal,
            ",".join(queue.name for queue in parent.task_consumer.queues),
        )


def _limits() -> StreamLimits | None:
    """The worker's limits; None in a process that runs one job at a time (a
    prefork pool child, an eager call), in a light worker (no streams) and in
    the web tier."""
    from synthesis.worker import process_stream_limits

    return process_stream_limits()
