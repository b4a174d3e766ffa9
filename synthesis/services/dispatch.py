"""Getting jobs into the broker: publishing, fair admission and aging.

Fairness between tenants is an admission problem. Each tenant has at most
`TENANT_BROKER_SLOTS` jobs per priority inside the broker (`queued`); the rest
wait in the database (`pending`) and are released, oldest first, whenever one of
the tenant's queued jobs is claimed or cancelled. The broker's queue therefore
interleaves tenants: one tenant's thousand jobs cannot stand in front of
another's ten. Strict priority between queues is the workers' job (`-Q` order).

Every publish bumps the job's epoch and the message carries it, so a message
from an earlier publish (before aging or a retry) is ignored when it arrives.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import random
import time
import uuid
from concurrent.futures import Future, wait
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from chorus.statements import Rows, Statement, commits_at_block_end, execute_together
from chorus.thread_pools import ForkSafeThreads
from quotas.plans import tenant_limits
from quotas.services import quota_refund
from synthesis.job_events import job_finished, jobs_released
from synthesis.job_lifecycle import Event, created_status, job_transition
from synthesis.job_rows import jobs_row_release
from synthesis.line_counts import (
    line_from_rows,
    line_statement,
    waiting_from_rows,
    waiting_of_job_statement,
    waiting_statement,
)
from synthesis.longform.lifecycle import longform_segment_failed
from synthesis.models import IdempotencyKey, Job, JobStatus
from synthesis.prestart import Prestart
from synthesis.publishers import send_synthesis
from synthesis.streaming import stream_announce_end
from tenants.locks import tenant_lock, tenant_lock_held, tenant_lock_held_by_row
from tenants.models import Tenant

log = logging.getLogger(__name__)

QUEUE_UNAVAILABLE = "queue_unavailable"
_HIGHER = {"low": "normal", "normal": "high"}
_RANK = {"high": 0, "normal": 1, "low": 2}


def job_publish(*, job: Job, countdown: float | None = None) -> bool:
    """Send the job to its priority's queue under a new epoch. On failure the job
    is failed and refunded at once: a job nobody can run must not look queued."""
    with transaction.atomic():
        # Only a job still waiting for a worker: one claimed meanwhile (by the
        # message this publish was meant to replace) keeps its epoch and runs once.
        bumped = Job.objects.filter(pk=job.pk, status=JobStatus.QUEUED).update(
            epoch=F("epoch") + 1, published_at=timezone.now()
        )
        if not bumped:
            return True  # nothing to send: it is running or has ended
        epoch = Job.objects.values_list("epoch", flat=True).get(pk=job.pk)
    return _send(job=job, epoch=epoch, countdown=countdown)


# The epoch of a job created straight into `queued` (see `job_publish_created`).
FIRST_EPOCH = 1


def created_dispatch_fields(*, queued: bool) -> dict[str, Any]:
    """The dispatch fields of a new job row: `queued` (sent right after commit by
    `job_publish_created`) or `pending` (its first epoch comes with its release).

    A queued row carries its `published_at` from the INSERT: stamping it after
    the send cost a statement and a commit of its own on every submit. A process
    that dies between the commit and the send leaves a queued job with no
    message; `jobs_republish_lost_messages` finds it as it finds any lost message:
    the sweeper once it is `LOST_AFTER_S` old, and any worker starting meanwhile
    once it is `SEND_GRACE_S` old (`jobs_recover_on_start`).
    """
    if not queued:
        return {"status": created_status(Event.HELD), "epoch": 0, "published_at": None}
    return {
        "status": created_status(Event.ADMITTED),
        "epoch": FIRST_EPOCH,
        "published_at": timezone.now(),
    }


def job_publish_created(*, job: Job) -> bool:
    """The first publish of a job inserted `queued` (`created_dispatch_fields`):
    the message goes out before any database work, as this is on the path to a
    stream's first audio. It carries what the engine needs, so that the worker
    starts it while its claim is on the way (`synthesis.prestart`)."""
    return _send(job=job, epoch=job.epoch, headers=_first_message_headers(job))


# The header of a job's first message when it was sent before the row's commit:
# the tenant whose lock the submit holds until then.
BEFORE_COMMIT_HEADER = "chorus_before_commit"

# How long a submit waits for its first message's send before its last round
# trip (`job_publish_before_commit`): a send takes about a millisecond, and a
# broker that stalls holds the transaction and the tenant's lock no longer.
SEND_AHEAD_WAIT_S = 0.05
# After a send that failed or outlasted that wait, submits stop waiting for
# theirs for this long: while the broker is down each would otherwise hold its
# tenant's lock the whole wait (one tenant's submits, 20 a second at most).
SEND_AHEAD_PAUSE_S = 5.0
_send_ahead_paused_until = 0.0


def job_publish_before_commit(*, job: Job) -> Future[None] | None:
    """`job_publish_created`, sent while the submit's transaction holds the
    tenant's lock and has yet to write the row and commit: the broker's hop to a
    worker then overlaps that round trip, on the way to a stream's first audio.
    A worker whose claim finds no row waits for the tenant's lock and claims
    again (`job_claim`); a submit that rolls back leaves a message that claims
    nothing (its engine's early first chunk is thrown away).

    None where this does not apply (SQLite, an inner transaction): publish after
    commit. Otherwise the send, made on a thread of its own: the caller waits
    for it up to `SEND_AHEAD_WAIT_S`, then sends its last round trip, so a
    broker that stalls holds the transaction and the tenant's lock no longer
    than that (and, for `SEND_AHEAD_PAUSE_S` after such a send, not at all).
    After the commit the caller waits for the rest of the send with
    `job_publish_sent`.

    Why the wait: a send made while the round trip's own Python runs takes turns
    with it for the interpreter: measured, it left 1.3 ms after its thread took
    it up (0.35 ms for the same call alone), with the round trip's 1.25 ms
    beside it. Waiting lets the message leave first; the round trip is then
    what the worker's claim waits for, and that has the engine's first chunk's
    time to spare. The price: the tenant's lock is held for the send's time,
    one Redis round trip more per submit."""
    if connection.vendor != "postgresql" or not commits_at_block_end():
        return None
    headers = {**(_first_message_headers(job) or {}), BEFORE_COMMIT_HEADER: job.tenant_id}
    send = functools.partial(send_synthesis, str(job.id), job.epoch, job.priority, 0, headers)
    # In the request's log context: the message carries its request id.
    sending = _senders.get().submit(contextvars.copy_context().run, send)
    if time.monotonic() >= _send_ahead_paused_until:
        wait([sending], timeout=SEND_AHEAD_WAIT_S)
        if not sending.done() or sending.exception() is not None:
            _pause_send_ahead()
    return sending


def _pause_send_ahead() -> None:
    """The broker is slow or down: submits stop waiting for their sends for a while."""
    global _send_ahead_paused_until
    _send_ahead_paused_until = time.monotonic() + SEND_AHEAD_PAUSE_S


def job_publish_sent(*, job: Job, sending: Future[None]) -> bool:
    """After the commit: the send `job_publish_before_commit` started, done. One
    that failed (it is tried once) is made again by `job_publish`, under a new
    epoch, so that a message that got through despite the error is stale; if
    that fails too, the job is failed and refunded."""
    try:
        sending.result()
    except Exception:
        _pause_send_ahead()
        log.warning("could not publish job %s before its commit; again after it", job.id)
        return job_publish(job=job)
    return True


# The sends made before a commit (`job_publish_before_commit`).
_senders = ForkSafeThreads(4, "publish")


def sent_before_commit(request: dict[str, Any]) -> int | None:
    """The tenant whose lock a task's message was sent under, before its job's
    row was committed (`job_publish_before_commit`); None for any other message."""
    tenant_id = request.get(BEFORE_COMMIT_HEADER)
    if isinstance(tenant_id, int) and not isinstance(tenant_id, bool) and 0 < tenant_id < 1 << 32:
        return tenant_id
    return None


def _first_message_headers(job: Job) -> dict[str, Any] | None:
    """A job's first message (its submit's, or its release's from `pending`)
    carries what its engine needs (`synthesis.prestart`)."""
    prestart = Prestart.of_job(job)
    return prestart.header() if prestart else None


def _send(
    *,
    job: Job,
    epoch: int,
    countdown: float | None = None,
    headers: dict[str, Any] | None = None,
) -> bool:
    try:
        send_synthesis(str(job.id), epoch, job.priority, countdown or 0, headers or {})
    except Exception:
        log.exception("could not publish job %s", job.id)
        with transaction.atomic():
            failed = job_transition(
                event=Event.PUBLISH_FAILED,
                job_id=job.pk,
                error_code=QUEUE_UNAVAILABLE,
                error_message="The job queue was unavailable; nothing was charged. "
                "Submit the job again.",
                finished_at=timezone.now(),
            )
            if failed:
                quota_refund(job_id=job.pk)
                job_finished(job=job, status=JobStatus.FAILED, code=QUEUE_UNAVAILABLE)
                # A retry with the same Idempotency-Key must get a new attempt,
                # not this job that never reached the queue.
                IdempotencyKey.objects.filter(job_id=job.pk).delete()
        if failed and job.stream:
            stream_announce_end(
                job_id=job.pk, code=QUEUE_UNAVAILABLE, message="The job queue was unavailable."
            )
        if failed and job.is_segment:
            longform_segment_failed(
                segment_id=job.pk, code=QUEUE_UNAVAILABLE, message="the job queue was unavailable."
            )
        return False
    return True


@dataclass(frozen=True)
class TenantLine:
    """A tenant's jobs in flight as admission sees them, read in one query."""

    in_flight: int  # single jobs pending, queued or running, of every priority
    pending: int  # of the new job's priority: 1 if any, else 0
    queued: int  # of the new job's priority, counted up to the broker slots


def tenant_line(*, tenant_id: int, priority: str) -> TenantLine:
    """Call under the tenant's lock: every submit-time count at once (the
    concurrency limit's and fair admission's), instead of a query for each."""
    [rows] = execute_together(
        [line_statement(tenant_id=tenant_id, priority=priority, slots=settings.TENANT_BROKER_SLOTS)]
    )
    return tenant_line_from(rows)


def tenant_line_from(rows: Rows | None) -> TenantLine:
    """The line read by `synthesis.line_counts.line_statement`, sent with the
    tenant's lock (`tenant_lock_then`) or alone (`tenant_line`)."""
    in_flight, pending, queued = line_from_rows(rows)
    return TenantLine(in_flight=in_flight, pending=pending, queued=queued)


def admission_slots(*, line: TenantLine) -> int:
    """How many new jobs of the line's priority may go straight to the broker (one
    job, or a long text's first segments), from the tenant's line read under its
    lock: none while older ones of this priority wait, or they would be overtaken
    (pending jobs are released oldest first)."""
    if line.pending:
        return 0
    return max(0, settings.TENANT_BROKER_SLOTS - line.queued)


def admission_refill(*, tenant_id: int, priority: str) -> int:
    """Release the tenant's oldest pending jobs of this priority into the free
    broker slots; returns how many were released."""
    if not _may_release(tenant_id=tenant_id, priority=priority):
        return 0
    return admission_release(tenant_id=tenant_id, priority=priority)


def admission_release(*, tenant_id: int, priority: str) -> int:
    """`admission_refill` once a look (`claim_look`) has said it could release."""
    with transaction.atomic():
        tenant_lock(tenant_id)
        # Released and stamped as published under a new epoch in one UPDATE, as
        # `job_publish` would in a transaction of its own per job: nothing can
        # claim them before their message exists (none carries the new epoch).
        released = jobs_row_release(
            tenant_id=tenant_id,
            priority=priority,
            slots=settings.TENANT_BROKER_SLOTS,
            now=timezone.now(),
        )
        if not released:
            return 0
        transaction.on_commit(
            lambda: (
                [
                    _send(job=job, epoch=job.epoch, headers=_first_message_headers(job))
                    for job in released
                ]
                and None
            )
        )
        transaction.on_commit(lambda: jobs_released(jobs=released))
    return len(released)


def _may_release(*, tenant_id: int, priority: str) -> bool:
    """Whether a refill could release anything: a pending job and a free slot.

    One round trip without the lock, so the common cases (nothing waits; the
    slots are full, as for most jobs of a busy tenant) never take it. Callers
    look after committing the change that may free a slot (a claim, a cancel).

    A change that adds pending jobs (a submit, a long text's segments) does so
    under the tenant's lock and does not look: a look cannot see a pending job
    whose transaction is still open, so on PostgreSQL the look checks the lock
    first, and while anyone holds it answers yes: `admission_refill` then waits
    for the lock and counts again under it. A submit that takes the lock after
    that check reads its line after the slot was freed, and queues its job
    itself. On SQLite every write transaction runs alone from its BEGIN
    (IMMEDIATE): a submit either committed before the slot was freed, and the
    look sees its job, or reads the freed slot."""
    slots = settings.TENANT_BROKER_SLOTS
    if connection.vendor == "postgresql":
        # After the check, in a snapshot of its own: a submit that released the
        # lock before the check has committed its job.
        look = [
            tenant_lock_held(tenant_id),
            waiting_statement(tenant_id=tenant_id, priority=priority, slots=slots),
        ]
    else:
        look = [waiting_statement(tenant_id=tenant_id, priority=priority, slots=slots)]
    return may_release_from(execute_together(look))


def claim_look(*, job_id: uuid.UUID | str) -> list[Statement]:
    """`_may_release`'s look for the tenant and priority of the job `job_id`, by
    its id: sent in the claim's own round trip, after its commit
    (`job_row_claim(then=...)`); its rows are read by `may_release_from`."""
    slots = settings.TENANT_BROKER_SLOTS
    key = Job._meta.pk.get_db_prep_value(job_id, connection)  # SQLite's is 32 hex digits
    waiting = waiting_of_job_statement(job_id=key, slots=slots)
    if connection.vendor != "postgresql":
        return [waiting]
    held = tenant_lock_held_by_row(
        table=Job._meta.db_table, row_id=key, name="job_tenant_lock_held"
    )
    return [held, waiting]


def may_release_from(rows: list[Rows | None]) -> bool:
    """What a look's rows say (`_may_release`, `claim_look`): on PostgreSQL
    (held, waiting), on SQLite (waiting)."""
    *held, waiting = rows
    if held and held[0] == [(True,)]:
        return True
    pending, queued = waiting_from_rows(waiting)
    return pending > 0 and queued < settings.TENANT_BROKER_SLOTS


def admission_refill_all() -> int:
    """Refill every (tenant, priority) that has pending jobs and a free broker
    slot: the sweeper's pass. One aggregate over the waiting jobs finds them, so
    tenants whose slots are full cost nothing more."""
    # order_by(): no ordering to carry into the grouping (a DISTINCT over these
    # columns once ran per pending job, the default ordering's created_at joined).
    pairs = (
        Job.objects.filter(status__in=(JobStatus.PENDING, JobStatus.QUEUED))
        .order_by()
        .values_list("tenant_id", "priority")
        .annotate(
            pending=Count("id", filter=Q(status=JobStatus.PENDING)),
            queued=Count("id", filter=Q(status=JobStatus.QUEUED)),
        )
    )
    return sum(
        admission_refill(tenant_id=t, priority=p)
        for t, p, pending, queued in pairs
        if pending and queued < settings.TENANT_BROKER_SLOTS
    )


# Most jobs one aging pass moves per priority: a large backlog moves in steps,
# not in one burst of updates and publishes.
AGING_BATCH = 200


def jobs_age() -> int:
    """Move jobs that waited too long one priority up, so `low` work still
    progresses under a steady `normal` load. Queued jobs are republished on the
    higher queue (their old message is then ignored: older epoch).

    Aging never lifts a job above `CHORUS_AGING_CEILING` (normal): `high` is for
    requests that asked for it (and may have a lane of their own), and a backlog
    of old bulk work must not crowd it. Nor past the tenant's plan.

    One UPDATE per step and batch, oldest first; at most `AGING_BATCH` jobs per
    step and pass."""
    moved = 0
    ceiling = _RANK[settings.AGING_CEILING]
    for priority, after_s in (
        ("normal", settings.AGE_NORMAL_TO_HIGH_S),
        ("low", settings.AGE_LOW_TO_NORMAL_S),
    ):
        higher = _HIGHER[priority]
        if _RANK[higher] < ceiling:
            continue
        cutoff = timezone.now() - timedelta(seconds=after_s)
        due = Job.objects.filter(
            priority=priority,
            status__in=(JobStatus.PENDING, JobStatus.QUEUED),
            created_at__lt=cutoff,
        )
        if not due.exists():  # the common case: no need to look at every tenant's plan
            continue
        due = due.exclude(tenant_id__in=_tenants_without(higher))
        with transaction.atomic():
            # Rows a claim or cancel holds are left to the next pass.
            ids = list(
                due.select_for_update(skip_locked=True, no_key=True)
                .order_by("created_at", "id")
                .values_list("pk", flat=True)[:AGING_BATCH]
            )
            if not ids:
                continue
            Job.objects.filter(pk__in=ids).update(priority=higher)
            requeued = list(
                Job.objects.filter(pk__in=ids, status=JobStatus.QUEUED).order_by("created_at", "id")
            )
        moved += len(ids)
        for job in requeued:
            job_publish(job=job)
    return moved


def _tenants_without(priority: str) -> list[int]:
    """Tenants whose plan (or override) does not include `priority`."""
    return [
        tenant.pk
        for tenant in Tenant.objects.select_related("plan")
        if priority not in tenant_limits(tenant).allowed_priorities
    ]


def retry_delay(attempt: int) -> float:
    """Exponential backoff with jitter for transient failures (storage, broker)."""
    base = min(30.0, 2.0**attempt)
    return base * random.uniform(0.5, 1.5)
