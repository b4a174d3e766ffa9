"""Submitting speech jobs (web tier). The worker side lives in `execution.py`."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from chorus.errors import ChorusError, NotFound
from quotas.limits import limits_check_priority, limits_check_text
from quotas.plans import tenant_limits
from quotas.services import quota_admit, quota_refund, quota_reserve
from synthesis.audio_out import FILE_EXTENSIONS, check_output
from synthesis.models import IN_FLIGHT, Job, JobStatus, Voice
from synthesis.storage_runtime import get_storage
from tenants.models import ApiKey, Tenant

log = logging.getLogger(__name__)


class QueueUnavailable(ChorusError):
    status = 503
    code = "queue_unavailable"


def job_output_key(*, job_id: uuid.UUID, audio_format: str) -> str:
    # Deterministic: a redelivered task overwrites its own object, never another's.
    return f"speech/{job_id}.{FILE_EXTENSIONS[audio_format]}"


def job_create(
    *,
    tenant: Tenant,
    api_key: ApiKey | None,
    text: str,
    voice_id: uuid.UUID | None = None,
    priority: str = "normal",
    audio_format: str = "wav",
    sample_rate: int | None = None,
    speed: float = 1.0,
    instruction: str = "",
    stream: bool = False,
) -> Job:
    limits = tenant_limits(tenant)
    limits_check_text(limits=limits, text=text)
    limits_check_priority(limits=limits, priority=priority)
    check_output(audio_format, sample_rate)  # refused now, not discovered by the worker
    voice = _voice_for(tenant=tenant, voice_id=voice_id)
    outcome: list[bool] = []
    with transaction.atomic():
        period = quota_admit(tenant=tenant, limits=limits, characters=len(text))
        job = Job.objects.create(
            tenant=tenant,
            api_key=api_key,
            voice=voice,
            voice_name=voice.name if voice else "",
            text=text,
            characters=len(text),
            priority=priority,
            format=audio_format,
            requested_sample_rate=sample_rate,
            speed=speed,
            instruction=instruction,
            stream=stream,
        )
        quota_reserve(period=period, job_id=job.id, characters=job.characters)
        # Publish only once the row is committed, or a fast worker could look
        # for a job that does not exist yet.
        transaction.on_commit(lambda: outcome.append(job_publish(job=job)))
    if outcome == [False]:  # published right after commit, and it failed
        raise QueueUnavailable(
            "The job queue is unavailable right now; nothing was charged. Try again shortly.",
            details={"job_id": str(job.id)},
        )
    return job


def _voice_for(*, tenant: Tenant, voice_id: uuid.UUID | None) -> Voice | None:
    if voice_id is None:
        return None
    voice = Voice.objects.filter(tenant=tenant, pk=voice_id).first()
    if voice is None:
        raise NotFound("No voice with this id.", details={"voice_id": str(voice_id)})
    return voice


def job_publish(*, job: Job) -> bool:
    """Hand the job to the broker on its priority's queue. On failure the job is
    failed and refunded at once: a job nobody can run must not look queued."""
    from synthesis.tasks import synthesize_job_task

    try:
        synthesize_job_task.apply_async(
            args=(str(job.id),),
            queue=f"synth.{job.priority}",
            retry=True,
            retry_policy={"max_retries": 2, "interval_start": 0, "interval_step": 0.2},
        )
    except Exception:
        log.exception("could not publish job %s", job.id)
        with transaction.atomic():
            failed = Job.objects.filter(pk=job.pk, status=JobStatus.QUEUED).update(
                status=JobStatus.FAILED,
                error_code=QueueUnavailable.code,
                error_message="The job queue was unavailable when this job was submitted.",
                finished_at=timezone.now(),
            )
            if failed:
                quota_refund(job_id=job.pk)
        return False
    return True


class JobNotCancellable(ChorusError):
    status = 409
    code = "job_not_cancellable"


def job_cancel(*, tenant: Tenant, job: Job) -> Job:
    """Stop a queued or running job and refund it, together.

    A queued job never starts (the worker's claim skips it); a running one stops
    at its next chunk boundary and its audio is discarded.
    """
    with transaction.atomic():
        cancelled = Job.objects.filter(pk=job.pk, tenant=tenant, status__in=IN_FLIGHT).update(
            status=JobStatus.CANCELLED,
            error_code="cancelled",
            error_message="The job was cancelled at your request; nothing was charged.",
            finished_at=timezone.now(),
        )
        if cancelled:
            quota_refund(job_id=job.pk)
    job.refresh_from_db()
    if not cancelled:
        raise JobNotCancellable(
            f"The job has already {job.status}; only queued or running jobs can be cancelled.",
            details={"status": job.status},
        )
    return job


def job_download_url(*, job: Job) -> tuple[str, datetime] | None:
    """A signed link to the job's audio and when it expires, once it has succeeded."""
    if job.status != JobStatus.SUCCEEDED or not job.output_key:
        return None
    if job.output_deleted_at is not None:
        return None
    ttl = tenant_limits(job.tenant).link_ttl_seconds
    url = get_storage().signed_url(
        bucket=job.tenant.bucket,
        key=job.output_key,
        expires_in=ttl,
        filename=f"{job.id}.{FILE_EXTENSIONS[job.format]}",
    )
    return url, timezone.now() + timedelta(seconds=ttl)
