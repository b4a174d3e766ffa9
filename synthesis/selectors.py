"""Reads, always scoped to one tenant: another tenant's objects do not exist."""

from __future__ import annotations

import uuid

from django.core.exceptions import ValidationError
from django.db.models import QuerySet, Sum

from chorus.errors import NotFound
from synthesis.models import IN_FLIGHT, Job, JobStatus, Voice
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
    """Bytes the tenant keeps in its bucket: voices plus audio not yet expired."""
    voices = Voice.objects.filter(tenant=tenant).aggregate(n=Sum("size_bytes"))["n"] or 0
    outputs = (
        Job.objects.filter(
            tenant=tenant, status=JobStatus.SUCCEEDED, output_deleted_at__isnull=True
        ).aggregate(n=Sum("output_bytes"))["n"]
        or 0
    )
    return int(voices) + int(outputs)
