"""Reads, always scoped to one tenant: another tenant's objects do not exist."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import Count, F, Q, QuerySet, Sum
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
        Job.objects.filter(tenant=tenant)
        .select_related("voice", "tenant__plan")
        .order_by("-created_at", "-id")
    )


def job_get(*, tenant: Tenant, job_id: uuid.UUID | str) -> Job:
    try:
        return Job.objects.select_related("voice", "tenant__plan").get(tenant=tenant, pk=job_id)
    except (Job.DoesNotExist, ValueError, ValidationError):
        raise NotFound("No speech job with this id.", details={"job_id": str(job_id)}) from None


def jobs_in_flight(*, tenant: Tenant) -> int:
    return Job.objects.filter(tenant=tenant, status__in=IN_FLIGHT).count()


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
    return job_queue_places(jobs=[job]).get(job.pk)


def job_queue_places(*, jobs: Iterable[Job]) -> dict[uuid.UUID, QueuePlace]:
    """Places of the waiting ones among `jobs` (one tenant's page, or one job).

    Every job of a higher priority starts first (workers take the queues in strict
    order, and each claim releases that tenant's next job of the priority); within
    a priority, the order of `synthesis.queue_line`. An estimate: aging and jobs
    submitted later reorder the line."""
    waiting = [job for job in jobs if job.status in WAITING]
    if not waiting:
        return {}
    lines = {priority: _line(priority) for priority in {job.priority for job in waiting}}
    counts = dict(
        Job.objects.filter(status__in=WAITING)
        .order_by()
        .values_list("priority")
        .annotate(n=Count("id"))
    )
    places: dict[uuid.UUID, QueuePlace] = {}
    service = _recent_service_seconds()
    workers = _live_worker_slots()
    busy = Job.objects.filter(status=JobStatus.RUNNING).count() if service and workers else 0
    for job in waiting:
        line = lines[job.priority]
        higher = sum(counts.get(p, 0) for p in _ORDER[: _ORDER.index(job.priority)])
        ahead = higher + line.ahead(tenant_id=job.tenant_id, index=_index_in_line(job, line))
        start = None
        if service is not None and workers:
            # Each slot first finishes what it runs, then works through the line ahead.
            waves = (ahead + busy) / workers
            start = timezone.now() + timedelta(seconds=waves * service)
        places[job.pk] = QueuePlace(position=ahead, estimated_start_at=start)
    return places


def _line(priority: str) -> Line:
    per_tenant = (
        Job.objects.filter(status__in=WAITING, priority=priority)
        .order_by()
        .values_list("tenant_id")
        .annotate(n=Count("id"))
    )
    # The broker's order is publish order; a job sent but not yet stamped was
    # sent last.
    queued = (
        Job.objects.filter(status=JobStatus.QUEUED, priority=priority)
        .order_by(F("published_at").asc(nulls_last=True), "created_at", "id")
        .values_list("pk", "tenant_id")
    )
    return Line(
        waiting=dict(per_tenant), queued=queued, slots_per_tenant=settings.TENANT_BROKER_SLOTS
    )


def _index_in_line(job: Job, line: Line) -> int:
    """The job's place among its tenant's waiting jobs of its priority: queued
    ones in queue order, then pending ones oldest first (as they are released)."""
    rank = line.queued_rank(job.pk)
    if rank is not None:
        return rank
    older = Job.objects.filter(
        tenant_id=job.tenant_id, priority=job.priority, status=JobStatus.PENDING
    ).filter(Q(created_at__lt=job.created_at) | Q(created_at=job.created_at, id__lt=job.id))
    return line.in_broker[job.tenant_id] + older.count()


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


def _live_worker_slots() -> int:
    alive_since = timezone.now() - timedelta(seconds=LOST_AFTER_S)
    return int(
        WorkerHeartbeat.objects.filter(seen_at__gte=alive_since).aggregate(n=Sum("slots"))["n"] or 0
    )
