"""Running a speech job on a worker: claim, synthesize, store, finish.

Every step is safe to repeat. A task can be delivered twice (late ack,
redelivery after a worker died): the claim is a conditional UPDATE that bumps
`attempts`, the output key is deterministic, and the final state is written only
by the attempt that still owns the job.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from chorus.errors import ChorusError, EngineError, NotFound
from quotas.services import quota_commit, quota_refund
from synthesis.audio import decode_reference, encode_wav
from synthesis.engines.base import Engine, PreparedVoice, ReferenceAudio
from synthesis.models import IN_FLIGHT, Job, JobStatus
from synthesis.services.jobs import job_output_key
from synthesis.storage_runtime import get_storage

log = logging.getLogger(__name__)

# Generous bounds for re-reading a reference that was validated at upload time.
_REFERENCE_READ_LIMIT = 256 * 1024 * 1024


@dataclass(frozen=True)
class Claim:
    job: Job
    attempt: int


# A job whose worker keeps dying (out of memory, a crash in native code) must not
# be redelivered forever, starving its queue.
MAX_ATTEMPTS = 3


def job_claim(*, job_id: uuid.UUID | str, worker: str) -> Claim | None:
    """Take the job for this attempt; None when it is finished, gone or worn out."""
    now = timezone.now()
    claimed = Job.objects.filter(pk=job_id, status__in=IN_FLIGHT, attempts__lt=MAX_ATTEMPTS).update(
        status=JobStatus.RUNNING, attempts=F("attempts") + 1, started_at=now, worker=worker
    )
    if not claimed:
        job_give_up(job_id=job_id)
        return None
    job = Job.objects.select_related("tenant", "voice").get(pk=job_id)
    return Claim(job=job, attempt=job.attempts)


def job_give_up(*, job_id: uuid.UUID | str) -> bool:
    """Fail and refund a job still in flight that has used all its attempts."""
    with transaction.atomic():
        failed = Job.objects.filter(
            pk=job_id, status__in=IN_FLIGHT, attempts__gte=MAX_ATTEMPTS
        ).update(
            status=JobStatus.FAILED,
            error_code="worker_lost",
            error_message=f"The worker running this job stopped {MAX_ATTEMPTS} times before "
            "it finished; nothing was charged. Submit it again, or contact the operator if "
            "it keeps happening.",
            finished_at=timezone.now(),
        )
        if failed:
            quota_refund(job_id=job_id)
    return bool(failed)


def job_execute(*, job_id: uuid.UUID | str, engine: Engine, worker: str) -> dict[str, Any]:
    claim = job_claim(job_id=job_id, worker=worker)
    if claim is None:
        return {"job_id": str(job_id), "status": "skipped"}
    job = claim.job
    try:
        samples = _synthesize(claim=claim, engine=engine)
        if samples is None:
            return {"job_id": str(job.id), "status": _why_stopped(job)}
        data = encode_wav(samples, engine.sample_rate)
        key = job_output_key(job_id=job.id, audio_format=job.format)
        get_storage().put(bucket=job.tenant.bucket, key=key, data=data, content_type="audio/wav")
        duration = samples.size / engine.sample_rate
        with transaction.atomic():
            finished = _owned(claim).update(
                status=JobStatus.SUCCEEDED,
                engine=engine.name,
                output_key=key,
                output_bytes=len(data),
                sample_rate=engine.sample_rate,
                duration_s=round(duration, 3),
                finished_at=timezone.now(),
            )
            if finished:
                quota_commit(job_id=job.id)
        if not finished:
            if _why_stopped(job) == "cancelled":
                # Only a cancelled job's object may go: a superseded attempt shares
                # the deterministic key with the attempt that replaced it.
                get_storage().delete(bucket=job.tenant.bucket, key=key)
                return {"job_id": str(job.id), "status": "cancelled"}
            return {"job_id": str(job.id), "status": "superseded"}
        log.info("job %s attempt %s: %.2f s of audio", job.id, claim.attempt, duration)
        return {"job_id": str(job.id), "status": "succeeded"}
    except ChorusError as exc:
        job_fail(claim=claim, code=exc.code, message=exc.message)
        return {"job_id": str(job.id), "status": "failed", "code": exc.code}
    except Exception:
        log.exception("job %s failed", job.id)
        job_fail(
            claim=claim,
            code="internal_error",
            message="Synthesis failed because of an internal error. "
            "Submit the job again; if it keeps failing, contact the operator.",
        )
        return {"job_id": str(job.id), "status": "failed", "code": "internal_error"}


def _synthesize(*, claim: Claim, engine: Engine) -> np.ndarray | None:
    """All the job's audio, or None when the job stopped being ours (cancelled,
    or superseded by a newer attempt): checked at every chunk boundary."""
    job = claim.job
    voice = _prepare_voice(job=job, engine=engine)
    chunks: list[np.ndarray] = []
    stream = engine.synthesize(text=job.text, voice=voice, speed=job.speed)
    try:
        for chunk in stream:
            if not any(len(c) for c in chunks) and len(chunk):
                still_ours = bool(_owned(claim).update(first_audio_at=timezone.now()))
            else:
                still_ours = _owned(claim).exists()
            if not still_ours:
                return None
            chunks.append(chunk)
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()
    samples = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)
    if samples.size == 0:
        raise EngineError("The engine produced no audio for this text.")
    return samples


def _owned(claim: Claim) -> Any:
    """Rows this attempt may still write: a newer attempt supersedes an older one."""
    return Job.objects.filter(pk=claim.job.pk, attempts=claim.attempt, status=JobStatus.RUNNING)


def job_fail(*, claim: Claim, code: str, message: str) -> bool:
    """Fail the job and refund it, together, if this attempt still owns it."""
    with transaction.atomic():
        failed = _owned(claim).update(
            status=JobStatus.FAILED,
            error_code=code,
            error_message=message,
            finished_at=timezone.now(),
        )
        if failed:
            quota_refund(job_id=claim.job.pk)
    return bool(failed)


def _why_stopped(job: Job) -> str:
    cancelled = Job.objects.filter(pk=job.pk, status=JobStatus.CANCELLED).exists()
    return "cancelled" if cancelled else "superseded"


def _prepare_voice(*, job: Job, engine: Engine) -> PreparedVoice | None:
    if job.voice is None:
        if job.voice_name:
            raise EngineError(
                f"The voice '{job.voice_name}' was deleted before this job ran. "
                "Submit the job again with an existing voice."
            )
        return None
    voice = job.voice
    try:
        data = get_storage().get(bucket=job.tenant.bucket, key=voice.audio_key)
    except NotFound:  # deleted after this job loaded its row
        raise EngineError(
            f"The voice '{voice.name}' was deleted before this job ran. "
            "Submit the job again with an existing voice."
        ) from None
    decoded = decode_reference(
        data,
        max_bytes=_REFERENCE_READ_LIMIT,
        min_seconds=0.0,
        max_seconds=3600.0,
        min_sample_rate=1,
    )
    reference = ReferenceAudio(
        samples=decoded.samples,
        sample_rate=decoded.sample_rate,
        transcript=voice.transcript,
        language=voice.language,
    )
    return engine.prepare_voice(reference)
