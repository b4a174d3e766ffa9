"""Reads, always scoped to one tenant: another tenant's objects do not exist."""

from __future__ import annotations

import functools
import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import QuerySet
from django.utils import timezone

from chorus.errors import NotFound
from chorus.statements import Statement, execute_together, model_from_row, select_columns
from quotas.counters import storage_used
from synthesis.heartbeat import LOST_AFTER_S
from synthesis.models import IN_FLIGHT, WAITING, Job, JobStatus, Voice
from synthesis.queue_line import Line
from synthesis.queue_reads import LineState, PendingRun, read_line, stored_id
from tenants.models import Tenant


def voice_list(*, tenant: Tenant) -> QuerySet[Voice]:
    return Voice.objects.filter(tenant=tenant).order_by("-created_at", "-id")


def voice_get(*, tenant: Tenant, voice_id: uuid.UUID | str) -> Voice:
    try:
        return Voice.objects.get(tenant=tenant, pk=voice_id)
    except (Voice.DoesNotExist, ValueError, ValidationError):
        raise NotFound("No voice with this id.", details={"voice_id": str(voice_id)}) from None


def job_list(*, tenant: Tenant) -> QuerySet[Job]:
    return (
        # Segments of long-form jobs are internal (`synthesis.longform`).
        Job.objects.filter(tenant=tenant, parent__isnull=True)
        .select_related("voice", "tenant__plan")
        .order_by("-created_at", "-id")
    )


def job_get(*, tenant: Tenant, job_id: uuid.UUID | str) -> Job:
    """The tenant's job (not a long-form job's segment), its `tenant` the one
    given. A poll is the request clients make most: the ORM's compiler took half
    of its CPU building this one statement (with joins to the voice, the tenant
    and its plan, which the caller holds already), so it is written out once,
    and prepared (`chorus.statements`)."""
    try:
        pk = Job._meta.pk.get_db_prep_value(uuid.UUID(str(job_id)), connection)
    except ValueError:
        pk = None
    rows = None
    if pk is not None:
        [rows] = execute_together(
            [Statement(_job_get_sql(connection.vendor), [pk, tenant.pk], "job_get")]
        )
    if not rows:
        raise NotFound("No speech job with this id.", details={"job_id": str(job_id)})
    job = model_from_row(Job, rows[0])
    job.tenant = tenant
    return job


@functools.cache
def _job_get_sql(vendor: str) -> str:
    table = connection.ops.quote_name(Job._meta.db_table)
    return (
        f"SELECT {select_columns(Job, vendor)} FROM {table} "
        "WHERE id = %s AND tenant_id = %s AND parent_id IS NULL"
    )


def jobs_in_flight(*, tenant: Tenant) -> int:
    """Single jobs queued or running: a batch's items are bounded by the batch's
    limits, so a running batch does not hold the plan's jobs at once; a long-form
    job counts once, not once per segment."""
    return Job.objects.filter(
        tenant=tenant, status__in=IN_FLIGHT, in_batch=False, parent__isnull=True
    ).count()


def storage_bytes_used(*, tenant: Tenant) -> int:
    """Bytes the tenant keeps in its bucket: voices plus audio not yet expired
    (a counter the services keep; see `quotas.counters`)."""
    return storage_used(tenant_id=tenant.pk)


@dataclass(frozen=True)
class QueuePlace:
    position: int  # jobs that will start before this one (0: next)
    estimated_start_at: datetime | None


_ORDER = ("high", "normal", "low")


def job_queue_place(*, job: Job) -> QueuePlace | None:
    """Where a waiting job stands: how many jobs start before it and, from
    recent service times and live workers, when it should start."""
    return job_queue_places(page=[job]).get(job.pk)


def job_queue_places(*, page: Iterable[Job]) -> dict[uuid.UUID, QueuePlace]:
    """Places of the waiting jobs on `page`: one job, or a page of one tenant's
    list (consecutive in created_at order), in one round trip
    (`synthesis.queue_reads`).

    Every job of a higher priority starts first (workers take the queues in strict
    order, and each claim releases that tenant's next job of the priority); within
    a priority, the order of `synthesis.queue_line`. An estimate: aging and jobs
    submitted later reorder the line."""
    waiting = [job for job in page if job.status in WAITING]
    if not waiting:
        return {}
    runs: dict[tuple[int, str], PendingRun] = {}
    in_run: dict[uuid.UUID, int] = {}  # a pending job's place in its run, oldest first
    run_sizes: dict[tuple[int, str], int] = defaultdict(int)
    for job in sorted(waiting, key=lambda j: (j.created_at, j.pk)):
        if job.status == JobStatus.PENDING:
            key = (job.tenant_id, job.priority)
            runs.setdefault(key, PendingRun(job.tenant_id, job.priority, oldest=job))
            in_run[job.pk] = run_sizes[key]
            run_sizes[key] += 1
    priorities = sorted({job.priority for job in waiting}, key=_ORDER.index)
    state = read_line(
        priorities=priorities,
        runs=list(runs.values()),
        alive_since=timezone.now() - timedelta(seconds=LOST_AFTER_S),
    )
    counts = {priority: sum(tenants.values()) for priority, tenants in state.waiting.items()}
    lines = {
        priority: Line(
            waiting=state.waiting.get(priority, {}),
            queued=state.queued[priority],
            slots_per_tenant=settings.TENANT_BROKER_SLOTS,
        )
        for priority in priorities
    }
    streams = _live_streams(state.heartbeats)
    busy = state.running if state.service_s and streams else 0
    places: dict[uuid.UUID, QueuePlace] = {}
    for job in waiting:
        line = lines[job.priority]
        index = _index_in_line(job, line, state, runs, in_run)
        higher = sum(counts.get(p, 0) for p in _ORDER[: _ORDER.index(job.priority)])
        ahead = higher + line.ahead(tenant_id=job.tenant_id, index=index)
        start = None
        workers = streams.get(job.priority, 0)
        if state.service_s is not None and workers:
            # The streams a job of this priority may use (a `low` job starts only
            # while fewer than the worker's `low` limit run) first finish what they
            # run, then work through the line ahead.
            waves = (ahead + busy) / workers
            start = timezone.now() + timedelta(seconds=waves * state.service_s)
        places[job.pk] = QueuePlace(position=ahead, estimated_start_at=start)
    return places


def _index_in_line(
    job: Job,
    line: Line,
    state: LineState,
    runs: dict[tuple[int, str], PendingRun],
    in_run: dict[uuid.UUID, int],
) -> int:
    """The job's place among its tenant's waiting jobs of its priority: queued
    ones in queue order, then pending ones oldest first (as they are released)."""
    rank = line.queued_rank(stored_id(job))
    if rank is not None:
        return rank
    if job.pk not in in_run:
        # Queued, but not in the line as read: released after a long line's shape
        # was read (`synthesis.queue_reads`). Behind its tenant's queued ones.
        return line.in_broker[job.tenant_id]
    run = runs[(job.tenant_id, job.priority)]
    return line.in_broker[job.tenant_id] + state.older[run] + in_run[job.pk]


def _live_streams(heartbeats: Iterable[tuple[str, int, int, int]]) -> dict[str, int]:
    """Per priority, the streams live workers that take its queue may start it on."""
    streams = dict.fromkeys(_ORDER, 0)
    for queues, high, normal, low in heartbeats:
        taken = queues.split(",") if queues else [f"synth.{p}" for p in _ORDER]
        for priority, n in zip(_ORDER, (high, normal, low), strict=True):
            if f"synth.{priority}" in taken:
                streams[priority] += n
    return streams
