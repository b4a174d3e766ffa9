"""Jobs whose worker is gone go back to their queue, or fail once worn out.

A threaded GPU worker runs several jobs in one process; if that process dies
(killed, out of memory, the machine lost) its messages stay unacknowledged in
the broker until the visibility timeout, far too long to wait. The job rows
say which worker runs them, and heartbeats say which workers are alive:

* a worker starting on a host requeues the jobs of workers on the same host
  whose process no longer exists (seconds after a crash and restart), and
  republishes lost messages then and once more a moment later
  (`jobs_recover_on_start`);
* the sweeper requeues the jobs of workers not seen for `LOST_AFTER_S`;
* both republish queued jobs whose message is gone (`jobs_republish_lost_messages`);
* a draining worker (SIGTERM) hands back the jobs it could not finish in time
  (`jobs_hand_back`), the same way, before it exits.

A requeue is a conditional UPDATE on the attempt that owned the job, and the
new publish carries a new epoch, so the old message, when the broker finally
redelivers it, is ignored; an attempt still running somewhere (a worker that
only looked dead) is superseded at its next chunk.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from chorus.processes import process_alive
from chorus.redis_client import get_redis
from synthesis.heartbeat import LOST_AFTER_S, worker_is_alive
from synthesis.job_events import job_requeued
from synthesis.job_lifecycle import TRANSITIONS, Event, job_transition
from synthesis.models import Job, JobStatus, WorkerHeartbeat
from synthesis.services.dispatch import job_publish
from synthesis.services.execution import MAX_ATTEMPTS, job_give_up

log = logging.getLogger(__name__)

SYNTH_TASK = "synthesis.synthesize_job"

# A live worker claims what it takes within milliseconds, and a live process
# sends a job's message within milliseconds of committing it `queued`: a job
# unclaimed, or without a message, this long after its publish has no live
# sender or taker (the sweeper waits longer, `LOST_AFTER_S`).
SEND_GRACE_S = 2.0


def job_requeue_lost(*, job: Job, reason: str = "worker_lost") -> str:
    """Put a running job whose attempt is lost back in its queue: "requeued",
    "failed" (attempts used up) or "" (it moved on meanwhile)."""
    if job.attempts >= MAX_ATTEMPTS:
        return "failed" if job_give_up(job_id=job.pk) else ""
    # Only the lost attempt's hold: a newer claim keeps the job.
    if not job_transition(event=Event.REQUEUED, job_id=job.pk, where=Q(attempts=job.attempts)):
        return ""
    job.status = TRANSITIONS[Event.REQUEUED].target
    job_requeued(job=job, reason=reason, attempt=job.attempts)
    job_publish(job=job)
    return "requeued"


def jobs_hand_back(*, worker: str) -> dict[str, int]:
    """Requeue the jobs `worker` still runs: its drain ran out (`synthesis.drain`).

    The attempts are still running in this very process: each is superseded by
    the conditional UPDATE, notices at its next chunk and stops without a word to
    its stream, whose client goes on with the next attempt's audio. One that
    finishes first keeps its job (and its one charge): the UPDATE finds nothing.
    """
    counts = {"requeued": 0, "failed": 0}
    for job in Job.objects.filter(status=JobStatus.RUNNING, worker=worker):
        outcome = job_requeue_lost(job=job, reason="worker_draining")
        if outcome:
            counts[outcome] += 1
    return counts


def job_send_back(*, job_id: str, epoch: int | None) -> bool:
    """Publish again, under a new epoch, a waiting job whose message a draining
    worker took and will not start (`synthesis.drain`); False for a stale message.

    Rejecting the message would not do: Celery sends a worker's acks and rejects
    from its event loop, which is stopped while the drain waits for the running
    jobs, so the message would go back only when the worker is gone. The taken
    message is acknowledged then instead, and the new one is already in line
    (at the back of its queue, as any publish).
    """
    current = Job.objects.filter(pk=job_id, status=JobStatus.QUEUED)
    job = (current if epoch is None else current.filter(epoch=epoch)).first()
    if job is None:
        return False
    job_requeued(job=job, reason="worker_draining")
    return job_publish(job=job)


def jobs_recover_on_start(*, host: str) -> threading.Timer:
    """What a worker starting on `host` does for its dead predecessors there, at
    once rather than at the sweeper's next pass: requeue the jobs they ran and
    republish the messages they took or were sending.

    A predecessor killed between committing a job `queued` (a release, a requeue)
    and sending its message, or just after taking one, left a job younger than
    the grace when this look runs, a second or two after the kill; it was
    published before this worker started, so one more look once the grace has
    passed finds it. That look runs on a thread of its own, returned so that a
    worker stopping first can cancel it: the worker is taking jobs meanwhile."""
    jobs_requeue_from_dead_workers(host=host)
    jobs_republish_lost_messages(older_than_s=SEND_GRACE_S)
    later = threading.Timer(SEND_GRACE_S, _republish_after_the_grace)
    later.daemon = True
    later.start()
    return later


def _republish_after_the_grace() -> None:
    try:
        jobs_republish_lost_messages(older_than_s=SEND_GRACE_S)
    except Exception:  # the sweeper finds what this missed
        log.warning("could not look for lost messages after starting", exc_info=True)
    finally:
        connection.close()  # this thread's own


def jobs_requeue_from_dead_workers(*, host: str | None = None) -> dict[str, int]:
    """Requeue running jobs whose worker is dead: on `host`, a process that no
    longer exists; anywhere, a worker whose heartbeat stopped."""
    now = timezone.now()
    running = list(Job.objects.filter(status=JobStatus.RUNNING).exclude(worker=""))
    beats = dict(
        WorkerHeartbeat.objects.filter(name__in={job.worker for job in running}).values_list(
            "name", "seen_at"
        )
    )
    counts = {"requeued": 0, "failed": 0}
    for job in running:
        if _worker_dead(job, beats.get(job.worker), now=now, host=host):
            outcome = job_requeue_lost(job=job)
            if outcome:
                counts[outcome] += 1
    return counts


def _worker_dead(job: Job, seen_at: datetime | None, *, now: datetime, host: str | None) -> bool:
    hostname, _, pid = job.worker.rpartition(":")
    if host is not None and hostname == host and pid.isdigit():
        return int(pid) != os.getpid() and not process_alive(int(pid))
    # No heartbeat yet: the worker's first beat may be a moment behind its first
    # claim, so judge by when the job started.
    last = seen_at or job.started_at
    return last is not None and not worker_is_alive(last, now)


# Where kombu's Redis transport keeps messages delivered to a consumer and not yet
# acknowledged (its default key names; Chorus does not change them).
UNACKED_KEY = "unacked"
UNACKED_INDEX_KEY = "unacked_index"


def jobs_republish_lost_messages(*, older_than_s: float = LOST_AFTER_S) -> int:
    """Republish queued jobs whose message is gone: taken by a worker that died
    before claiming it, or lost on the way.

    With threads, the process that pops messages off the queues is the one that
    may be killed, so a message can be lost between the pop and kombu's record
    of it, or sit unacknowledged for its dead taker until the visibility timeout
    (twice the task limit). Fair admission keeps few messages in the broker, so
    a look at all of them is cheap: a job queued for `older_than_s` whose message
    of its current epoch is in no queue, or only unacknowledged that long (a live
    worker claims what it takes at once), gets a new publish; the old delivery,
    if any, is dropped. Racing a worker that is claiming it right now costs
    nothing but a skipped message: the claim or the publish wins, not both.
    """
    client = get_redis()
    if client is None:
        return 0
    cutoff = time.time() - older_than_s
    waiting = {
        (str(job.pk), job.epoch): job
        for job in Job.objects.filter(
            status=JobStatus.QUEUED,
            published_at__lt=timezone.now() - timedelta(seconds=older_than_s),
        )
    }
    if not waiting:
        return 0
    in_queues = {
        delivered
        for queue in settings.SYNTH_QUEUES
        for raw in client.lrange(queue, 0, -1)
        if (delivered := _job_of(_loads(raw))) is not None
    }
    scored: list[Any] = client.zrange(UNACKED_INDEX_KEY, 0, -1, withscores=True)
    delivered_at = {tag: float(score) for tag, score in scored}
    # (job id, epoch) -> (delivery tag, the delivered message)
    unacked: dict[tuple[str, int], tuple[Any, dict[str, Any]]] = {}
    entries: dict[Any, Any] = client.hgetall(UNACKED_KEY)
    for tag, raw in entries.items():
        message = _loads(raw, index=0)
        entry = _job_of(message)
        if entry is not None:
            unacked[entry] = (tag, message)
    republished = 0
    for key, job in waiting.items():
        if key in in_queues:
            continue
        if key in unacked:
            tag, message = unacked[key]
            if delivered_at.get(tag, 0.0) > cutoff or _held_back(message):
                continue  # just taken by a live worker, or a retry's countdown
            pipe = client.pipeline()
            pipe.zrem(UNACKED_INDEX_KEY, tag)
            pipe.hdel(UNACKED_KEY, tag)
            pipe.execute()
        republished += int(job_publish(job=job))
    return republished


def _loads(raw: Any, *, index: int | None = None) -> dict[str, Any]:
    """A message as kombu stores it in Redis (an unacknowledged entry is
    [message, exchange, routing key]: `index=0`); {} when it is not one."""
    try:
        value = json.loads(raw)
        value = value[index] if index is not None else value
    except (ValueError, IndexError, KeyError, TypeError):
        return {}
    return value if isinstance(value, dict) else {}


def _job_of(message: dict[str, Any]) -> tuple[str, int] | None:
    """(job id, epoch) of a synthesis task message."""
    try:
        if (message.get("headers") or {}).get("task") != SYNTH_TASK:
            return None
        args = json.loads(base64.b64decode(message["body"]))[0]
        return str(uuid.UUID(str(args[0]))), int(args[1])
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None


def _held_back(message: dict[str, Any]) -> bool:
    """A retry published with a countdown waits, unacknowledged, until it is due."""
    eta = (message.get("headers") or {}).get("eta")
    if not isinstance(eta, str):
        return False
    try:
        return datetime.fromisoformat(eta) > timezone.now()
    except (ValueError, TypeError):
        return False
