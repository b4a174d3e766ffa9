"""Reads, always scoped to one tenant: another tenant's objects do not exist."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import Count, F, Q, QuerySet
from django.utils import timezone

from chorus.errors import NotFound
from quotas.counters import storage_used
from synthesis.heartbeat import LOST_AFTER_S
from synthesis.models import IN_FLIGHT, WAITING, Job, JobStatus, Voice, WorkerHeartbeat
from synthesis.queue_line import Line
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
    try:
        return Job.objects.select_related("voice", "tenant__plan").get(
            tenant=tenant, pk=job_id, parent__isnull=True
        )
    except (Job.DoesNotExist, ValueError, ValidationError):
        raise NotFound("No speech job with this id.", details={"job_id": str(job_id)}) from None


def jobs_in_flight(*, tenant: Tenant) -> int:
    """Single jobs queued or running: a batch's items are bounded by the batch's
    limits, so a running batch does not hold the plan's jobs at once; a long-form
    job counts once, not once per segment."""
    return Job.objects.filter(
        tenant=tenant, status__in=IN_FLIGHT, batch_item__isnull=True, parent__isnull=True
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
    list (consecutive in created_at order), in a fixed number of queries.

    Every job of a higher priority starts first (workers take the queues in strict
    order, and each claim releases that tenant's next job of the priority); within
    a priority, the order of `synthesis.queue_line`. An estimate: aging and jobs
    submitted later reorder the line."""
    waiting = [job for job in page if job.status in WAITING]
    if not waiting:
        return {}
    # One pass over the waiting line (its partial index) gives both what each
    # priority holds and each tenant's share of it.
    per_tenant: dict[str, dict[int, int]] = defaultdict(dict)
    for priority, tenant_id, n in (
        Job.objects.filter(status__in=WAITING)
        .order_by()
        .values_list("priority", "tenant_id")
        .annotate(n=Count("id"))
    ):
        per_tenant[priority][tenant_id] = n
    counts = {priority: sum(tenants.values()) for priority, tenants in per_tenant.items()}
    lines = {
        priority: _line(priority, waiting=per_tenant[priority])
        for priority in {job.priority for job in waiting}
    }
    places: dict[uuid.UUID, QueuePlace] = {}
    service = _recent_service_seconds()
    streams = _live_streams()
    busy = Job.objects.filter(status=JobStatus.RUNNING).count() if service and streams else 0
    indexes = _indexes_in_lines(waiting, lines)
    for job in waiting:
        line = lines[job.priority]
        higher = sum(counts.get(p, 0) for p in _ORDER[: _ORDER.index(job.priority)])
        ahead = higher + line.ahead(tenant_id=job.tenant_id, index=indexes[job.pk])
        start = None
        workers = streams.get(job.priority, 0)
        if service is not None and workers:
            # The streams a job of this priority may use (a `low` job starts only
            # while fewer than the worker's `low` limit run) first finish what they
            # run, then work through the line ahead.
            waves = (ahead + busy) / workers
            start = timezone.now() + timedelta(seconds=waves * service)
        places[job.pk] = QueuePlace(position=ahead, estimated_start_at=start)
    return places


def _line(priority: str, *, waiting: dict[int, int]) -> Line:
    """`waiting`: the priority's pending plus queued jobs per tenant."""
    # The broker's order is publish order; a job sent but not yet stamped was
    # sent last.
    queued = (
        Job.objects.filter(status=JobStatus.QUEUED, priority=priority)
        .order_by(F("published_at").asc(nulls_last=True), "created_at", "id")
        .values_list("pk", "tenant_id")
    )
    return Line(waiting=waiting, queued=queued, slots_per_tenant=settings.TENANT_BROKER_SLOTS)


def _indexes_in_lines(waiting: list[Job], lines: dict[str, Line]) -> dict[uuid.UUID, int]:
    """Each job's place among its tenant's waiting jobs of its priority: queued
    ones in queue order, then pending ones oldest first (as they are released).

    The pending jobs of one priority on a page are consecutive among the tenant's
    pending jobs (the page is a run of its jobs in created_at order): one count of
    those older than the page's oldest places them all."""
    indexes: dict[uuid.UUID, int] = {}
    pending: dict[tuple[int, str], list[Job]] = defaultdict(list)
    for job in waiting:
        rank = lines[job.priority].queued_rank(job.pk)
        if rank is not None:
            indexes[job.pk] = rank
        else:
            pending[(job.tenant_id, job.priority)].append(job)
    for (tenant_id, priority), jobs in pending.items():
        jobs.sort(key=lambda j: (j.created_at, j.id))
        first = jobs[0]
        older = (
            Job.objects.filter(tenant_id=tenant_id, priority=priority, status=JobStatus.PENDING)
            .filter(
                Q(created_at__lt=first.created_at) | Q(created_at=first.created_at, id__lt=first.id)
            )
            .count()
        )
        base = lines[priority].in_broker[tenant_id] + older
        for n, job in enumerate(jobs):
            indexes[job.pk] = base + n
    return indexes


def _recent_service_seconds(sample: int = 50) -> float | None:
    spans = [
        (finished - started).total_seconds()
        for started, finished in _recent_successes(sample)
        if started and finished
    ]
    return sum(spans) / len(spans) if spans else None


def _recent_successes(sample: int) -> QuerySet[Job, tuple[datetime | None, datetime | None]]:
    """Start and end of the latest successes: `sample` rows off the end of an
    index (`job_recent_success`), however many jobs have ever run."""
    return (
        Job.objects.filter(status=JobStatus.SUCCEEDED, finished_at__isnull=False)
        .order_by("-finished_at")
        .values_list("started_at", "finished_at")[:sample]
    )


def _live_streams() -> dict[str, int]:
    """Per priority, the streams live workers that take its queue may start it on."""
    alive_since = timezone.now() - timedelta(seconds=LOST_AFTER_S)
    rows = WorkerHeartbeat.objects.filter(seen_at__gte=alive_since).values_list(
        "queues", "slots", "streams_normal", "streams_low"
    )
    streams = dict.fromkeys(_ORDER, 0)
    for queues, high, normal, low in rows:
        taken = queues.split(",") if queues else [f"synth.{p}" for p in _ORDER]
        for priority, n in zip(_ORDER, (high, normal, low), strict=True):
            if f"synth.{priority}" in taken:
                streams[priority] += n
    return streams
