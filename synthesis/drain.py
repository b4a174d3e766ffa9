"""A GPU worker's drain on SIGTERM: finish what it can, hand back the rest, leave.

Spot and preemptible machines give 30 s to 2 min of notice (SIGTERM) before they
stop, and Kubernetes sends the same signal when it deletes a pod, killing it
`terminationGracePeriodSeconds` later. Celery's warm shutdown alone stops taking
messages and then waits for the running jobs with no deadline; the streams die
with the machine. From the signal on:

* nothing new starts: Celery cancels its consumer, and a job whose message it
  took in the moment before is not started but published again at once, for
  another worker (`job_send_back`), rather than after the broker's visibility
  timeout or once this worker is gone;
* the heartbeat row says `draining_since` at once: `manage.py worker_ready`
  fails, and queue estimates stop counting this worker's streams;
* running jobs go on for up to `CHORUS_WORKER_DRAIN_S`; at that deadline the
  ones still running are handed back (`jobs_hand_back`): requeued under a new
  epoch for another worker, the attempts here superseded, charged once, and
  their streams continued by the next attempt (or ended with a stable code);
* Celery's warm shutdown then ends as the superseded attempts stop, at their
  next chunk. An attempt that does not stop (an engine call that never returns)
  does not hold the process: it leaves `HAND_BACK_WAIT_S` after the hand-back.

A light worker keeps Celery's plain warm shutdown (no heartbeat, no drain): its
tasks are short and safe to run again. Only a threads-pool GPU worker drains; a
prefork one's children hold their own engines and heartbeats.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass

from django.db import connection

from synthesis.heartbeat import Heartbeat
from synthesis.services.recovery import jobs_hand_back

log = logging.getLogger(__name__)

# After the hand-back, how long the superseded attempts get to notice (a chunk
# or two; a voice prompt being prepared) before the process leaves regardless.
# Deployments give the drain a margin of at least this over CHORUS_WORKER_DRAIN_S.
HAND_BACK_WAIT_S = 10.0
_POLL_S = 0.1


@dataclass
class _Drain:
    worker: str
    heartbeat: Heartbeat
    drain_s: float
    began: float  # time.monotonic()
    ended_before: int  # the heartbeat's finished jobs when it began
    handed_back: int = 0
    given_up: int = 0
    sent_back: int = 0
    reported: bool = False


_draining = threading.Event()
_current: _Drain | None = None
_lock = threading.Lock()


def is_draining() -> bool:
    return _draining.is_set()


def record_sent_back(sent: bool) -> None:
    """Count a job taken after the signal and published again unstarted (the
    drain's last line says how many)."""
    drain = _current
    if drain is not None and sent:
        with _lock:
            drain.sent_back += 1


def drain_start(*, worker: str, heartbeat: Heartbeat, drain_s: float) -> None:
    """Begin the drain; a second signal changes nothing. Called from the signal
    handler, so the work (database writes, waiting) is on a thread of its own."""
    global _current
    with _lock:
        if _draining.is_set():
            return
        _draining.set()
        _current = _Drain(
            worker=worker,
            heartbeat=heartbeat,
            drain_s=drain_s,
            began=time.monotonic(),
            ended_before=heartbeat.done + heartbeat.failed,
        )
    threading.Thread(target=_run, args=(_current,), name="drain", daemon=True).start()


def _run(drain: _Drain) -> None:
    heartbeat = drain.heartbeat
    log.info(
        "draining: taking no new jobs; %d running get %g s to finish",
        heartbeat.busy,
        drain.drain_s,
    )
    try:
        heartbeat.drain()
    except Exception:  # readiness then fails at the next beat instead
        log.warning("could not mark this worker draining", exc_info=True)
    try:
        if not _wait_idle(heartbeat, until=drain.began + drain.drain_s):
            _hand_back(drain)
            if not _wait_idle(heartbeat, until=time.monotonic() + HAND_BACK_WAIT_S):
                log.error(
                    "%d jobs still running %g s after they were handed back; leaving",
                    heartbeat.busy,
                    HAND_BACK_WAIT_S,
                )
                drain_report()
                os._exit(1)
    finally:
        connection.close()  # this thread's own


def _wait_idle(heartbeat: Heartbeat, *, until: float) -> bool:
    """Whether every running job ended before `until`."""
    while heartbeat.busy:
        if time.monotonic() >= until:
            return False
        time.sleep(_POLL_S)
    return True


def _hand_back(drain: _Drain) -> None:
    try:
        counts = jobs_hand_back(worker=drain.worker)
    except Exception:  # the sweeper requeues them once this worker's beats stop
        log.exception("could not hand back this worker's running jobs")
        return
    drain.handed_back, drain.given_up = counts["requeued"], counts["failed"]


def drain_report() -> None:
    """The drain's last line (once), when the worker's pool has stopped."""
    drain = _current
    if drain is None or drain.reported:
        return
    drain.reported = True
    heartbeat = drain.heartbeat
    log.info(
        "drained in %.1f s: %d jobs finished, %d handed back, %d failed (attempts used up), "
        "%d taken but not started (sent back)",
        time.monotonic() - drain.began,
        heartbeat.done + heartbeat.failed - drain.ended_before,
        drain.handed_back,
        drain.given_up,
        drain.sent_back,
    )
