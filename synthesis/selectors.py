"""Reads, always scoped to one tenant: another tenant's objects do not exist."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.core.exceptions import ValidationError
from django.db.models import Q, QuerySet, Sum
from django.utils import timezone

from chorus.errors import NotFound
from quotas.counters import storage_used
from synthesis.heartbeat import LOST_AFTER_S
from synthesis.models import IN_FLIGHT, WAITING, Job, JobStatus, Voice, WorkerHeartbeat
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


_RANK = {"high": 0, "normal": 1, "low": 2}


def job_queue_place(*, job: Job) -> QueuePlace | None:
    """Where a waiting job stands: jobs ahead of it (higher priority, or the same
    priority and older) and, from recent service times and live workers, when it
    should start. An estimate: aging and fair admission reorder the line."""
    if job.status not in WAITING:
        return None
    higher = [p for p, rank in _RANK.items() if rank < _RANK[job.priority]]
    ahead = (
        Job.objects.filter(status__in=WAITING)
        .filter(Q(priority__in=higher) | Q(priority=job.priority, created_at__lt=job.created_at))
        .count()
    )
    service = _recent_service_seconds()
    workers = _live_worker_slots()
    if service is None or workers == 0:
        return QueuePlace(position=ahead, estimated_start_at=None)
    busy = Job.objects.filter(status=JobStatus.RUNNING).count()
    # Each slot first finishes what it runs, then works through the line ahead.
    waves = (ahead + busy) / workers
    return QueuePlace(
        position=ahead, estimated_start_at=timezone.now() + timedelta(seconds=waves * service)
    )


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
