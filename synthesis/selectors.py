"""Reads, always scoped to one tenant: another tenant's objects do not exist."""

from __future__ import annotations

import uuid

from django.core.exceptions import ValidationError
from django.db.models import QuerySet

from chorus.errors import NotFound
from synthesis.models import Job, Voice
from tenants.models import Tenant


def voice_list(*, tenant: Tenant) -> QuerySet[Voice]:
    return Voice.objects.filter(tenant=tenant).order_by("-created_at", "-id")


def voice_get(*, tenant: Tenant, voice_id: uuid.UUID | str) -> Voice:
    try:
        return Voice.objects.get(tenant=tenant, pk=voice_id)
    except (Voice.DoesNotExist, ValueError, ValidationError):
        raise NotFound("No voice with this id.", details={"voice_id": str(voice_id)}) from None


def job_list(*, tenant: Tenant) -> QuerySet[Job]:
    return Job.objects.filter(tenant=tenant).select_related("voice").order_by("-created_at", "-id")


def job_get(*, tenant: Tenant, job_id: uuid.UUID | str) -> Job:
    try:
        return Job.objects.select_related("voice").get(tenant=tenant, pk=job_id)
    except (Job.DoesNotExist, ValueError, ValidationError):
        raise NotFound("No speech job with this id.", details={"job_id": str(job_id)}) from None
