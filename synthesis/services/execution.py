"""Running a speech job on a worker: claim, synthesize, store, finish.

Every step is safe to repeat. A task can be delivered twice (late ack,
redelivery after a worker died): the claim is a conditional UPDATE that bumps
`attempts`, the output key is deterministic, and the final state is written only
by the attempt that still owns the job.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import numpy as np
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from chorus.db import patiently
from chorus.errors import ChorusError, EngineError, NotFound, StorageError
from chorus.statements import Rows
from quotas.services import quota_commit, quota_commit_spoken, quota_refund
from synthesis.audio import decode_reference
from synthesis.audio_out import EncodedAudio, encode_output
from synthesis.engines.base import Engine, PreparedVoice, ReferenceAudio, Samples, close_stream
from synthesis.job_events import (
    job_finished,
    job_finished_by_id,
    job_first_audio,
    job_requeued,
    job_started,
)
from synthesis.job_lifecycle import Event, job_transition
from synthesis.job_rows import job_row_claim, job_row_stamp_owned, job_row_update_owned
from synthesis.longform.lifecycle import longform_segment_failed, longform_segment_succeeded
from synthesis.models import Job, JobStatus
from synthesis.prestart import EarlyStart, Prestart, early_start
from synthesis.provenance import SIDECAR_CONTENT_TYPE, SignedAudio, sidecar_key, sign_job_output
from synthesis.services.dispatch import (
    admission_release,
    claim_look,
    job_publish,
    may_release_from,
    retry_delay,
)
from synthesis.services.jobs import job_output_key
from synthesis.services.voices import voice_prompt_key
from synthesis.storage.retry import put_patiently
from synthesis.storage_runtime import get_storage
from synthesis.streaming import ChunkSink, sink_for, stream_announce_end
from synthesis.voice_cache import VoicePromptCache
from tenants.locks import tenant_lock_wait

log = logging.getLogger(__name__)

# Generous bounds for re-reading a reference that was validated at upload time.
_REFERENCE_READ_LIMIT = 256 * 1024 * 1024


T = TypeVar("T")


@dataclass(frozen=True)
class Claim:
    job: Job
    attempt: int


# A job whose worker keeps dying (out of memory, a crash in native code) must not
# be redelivered forever, starving its queue.
MAX_ATTEMPTS = 3


def job_claim(
    *,
    job_id: uuid.UUID | str,
    worker: str,
    epoch: int | None = None,
    before_commit: int | None = None,
) -> Claim | None:
    """Take the job for this attempt; None when it is finished, gone, worn out,
    or the message is from an earlier publish (`epoch`) than the job's latest.

    A `running` job may be claimed again: that is the same message redelivered
    after its worker died, and the new attempt supersedes the dead one.

    `before_commit`: the message was sent before its row was committed, under
    this tenant's lock (`dispatch.job_publish_before_commit`). A claim that finds
    nothing then waits for that lock, and claims once more: the row is committed
    by then, or will never be.
    """
    claimed = _claim(job_id=job_id, worker=worker, epoch=epoch)
    if claimed is None and before_commit is not None:
        if not submit_wait(before_commit):
            return None  # a row committed later is the sweeper's, as a lost message
        claimed = _claim(job_id=job_id, worker=worker, epoch=epoch)
    if claimed is None:
        patiently(lambda: job_give_up(job_id=job_id), patience_s=CLAIM_PATIENCE_S)
        return None
    job, look = claimed
    if may_release_from(look):  # the common case, nothing to release, costs no query more
        patiently(
            lambda: admission_release(tenant_id=job.tenant_id, priority=job.priority),
            patience_s=CLAIM_PATIENCE_S,
        )
    job_started(job=job, attempt=job.attempts)
    return Claim(job=job, attempt=job.attempts)


# How long a message sent before its row's commit waits for that commit: a
# submit's transaction takes milliseconds; one stalled this long (its process
# stopped, its network gone) is not waited for by a GPU worker's thread.
SUBMIT_WAIT_S = 10.0


def submit_wait(tenant_id: int) -> bool:
    """Wait for the submit that sent a message before its row's commit: until
    no one holds the tenant's lock (`dispatch.job_publish_before_commit`). False
    after `SUBMIT_WAIT_S`."""
    ended = patiently(
        lambda: tenant_lock_wait(tenant_id, timeout_s=SUBMIT_WAIT_S), patience_s=CLAIM_PATIENCE_S
    )
    if not ended:
        log.warning("the submit of tenant %s held its lock past %.0f s", tenant_id, SUBMIT_WAIT_S)
    return ended


def _claim(
    *, job_id: uuid.UUID | str, worker: str, epoch: int | None
) -> tuple[Job, list[Rows | None]] | None:
    """The claimed row and the look after it; None when nothing was claimed."""
    # One statement: the conditional UPDATE returns the row it changed. Its
    # `started_at`, like the first audio's and the end's stamps below, is the
    # database's time (`chorus.db_clock`): a worker host's clock, 3 s ahead say,
    # must not show in the queue wait. A monotonic clock would not do: the wait
    # starts on another host, at the submit.
    #
    # One of the tenant's broker slots frees with it: once the claim is
    # committed, in the same round trip, a look for a pending job of the
    # tenant's to release into it (`dispatch.claim_look`).
    job, look = patiently(
        lambda: job_row_claim(
            job_id=job_id,
            worker=worker,
            max_attempts=MAX_ATTEMPTS,
            epoch=epoch,
            then=claim_look(job_id=job_id),
        ),
        patience_s=CLAIM_PATIENCE_S,
    )
    return None if job is None else (job, look)


# How long a worker keeps trying the database before it gives a message up. The
# broker counts a message as delivered once the task ends, even if it ends in an
# error: a claim that failed on a database restart or a pool briefly exhausted
# would lose its message (the sweeper would find the job again, seconds later).
CLAIM_PATIENCE_S = 30.0
# A claimed job's own writes (its stamps, its end with its charge) wait longer:
# failing one would leave the job `running` under a live worker, found only by
# the sweeper's task time limit (ten minutes), and nothing else can run on this
# worker while the database is gone anyway. Past this, the sweeper it is.
JOB_PATIENCE_S = 300.0


def through_outage(step: Callable[[], T]) -> T:
    """A claimed job's database step, tried again until the database is back."""
    return patiently(step, patience_s=JOB_PATIENCE_S)


def job_give_up(*, job_id: uuid.UUID | str) -> bool:
    """Fail and refund a job still in flight that has used all its attempts."""
    with transaction.atomic():
        failed = job_transition(
            event=Event.GAVE_UP,
            job_id=job_id,
            where=Q(attempts__gte=MAX_ATTEMPTS),
            error_code="worker_lost",
            error_message=f"The worker running this job stopped {MAX_ATTEMPTS} times before "
            "it finished; nothing was charged. Submit it again, or contact the operator if "
            "it keeps happening.",
            finished_at=Now(),
        )
        if failed:
            quota_refund(job_id=job_id)
    if failed:
        job_finished_by_id(job_id=job_id, status=JobStatus.FAILED, code="worker_lost")
        longform_segment_failed(
            segment_id=job_id,
            code="worker_lost",
            message=f"its worker stopped {MAX_ATTEMPTS} times; nothing was charged.",
        )
    if failed and Job.objects.filter(pk=job_id, stream=True).exists():
        stream_announce_end(
            job_id=job_id,
            code="worker_lost",
            message="The worker running this job stopped before it finished; nothing was charged.",
        )
    return bool(failed)


def job_execute(
    *,
    job_id: uuid.UUID | str,
    engine: Engine,
    worker: str,
    prompts: VoicePromptCache | None = None,
    epoch: int | None = None,
    prestart: Prestart | None = None,
    before_commit: int | None = None,
) -> dict[str, Any]:
    """Run one delivery of a job. `prompts` is the worker's prompt cache (a
    throwaway one when none is given: the prompt then comes from storage).
    Compare it with None, not truthiness: an empty cache has length 0.
    `prestart`: what the message says the job asks for, to start the engine with
    while the claim is on its way (`synthesis.prestart`). `before_commit`: see
    `job_claim`."""
    early = early_start(prestart, engine=engine, prompts=prompts)
    try:
        return _execute(
            job_id=job_id,
            engine=engine,
            worker=worker,
            prompts=prompts,
            epoch=epoch,
            early=early,
            before_commit=before_commit,
        )
    finally:
        if early is not None:
            early.close()  # unless the job's run took it over


def _execute(
    *,
    job_id: uuid.UUID | str,
    engine: Engine,
    worker: str,
    prompts: VoicePromptCache | None,
    epoch: int | None,
    early: EarlyStart | None,
    before_commit: int | None,
) -> dict[str, Any]:
    claim = job_claim(job_id=job_id, worker=worker, epoch=epoch, before_commit=before_commit)
    if claim is None:  # `job_execute` closes the early stream before the task ends
        return {"job_id": str(job_id), "status": "skipped"}
    job = claim.job
    if job.realtime:
        if early is not None:
            early.close()  # before the session opens a stream of its own
        assert _session_run, "synthesis.realtime.execution registers how a session runs"
        cache = prompts if prompts is not None else VoicePromptCache(1)
        return _session_run[0](claim=claim, engine=engine, prompts=cache)
    sink = sink_for(job, attempt=claim.attempt, engine=engine)
    try:
        samples = _synthesize(
            claim=claim,
            engine=engine,
            prompts=prompts if prompts is not None else VoicePromptCache(1),
            sink=sink,
            early=early,
        )
        if samples is None:
            why = through_outage(lambda: why_stopped(job))
            if why == "cancelled":  # a superseded attempt leaves the stream to its successor
                sink.fail(code=why, message="The job was cancelled.")
            return {"job_id": str(job.id), "status": why}
        audio = encode_output(
            samples, engine.sample_rate, format=job.format, sample_rate=job.requested_sample_rate
        )
        key, signed = store_output(job=job, engine=engine.name, audio=audio)
        duration = audio.duration_s
        finished_at = through_outage(
            lambda: succeed(
                claim,
                engine=engine.name,
                output_key=key,
                output_bytes=len(signed.data),
                provenance=signed.mode,
                sample_rate=audio.sample_rate,
                duration_s=round(duration, 3),
            )
        )
        if finished_at is None:
            if through_outage(lambda: why_stopped(job)) == "cancelled":
                sink.fail(code="cancelled", message="The job was cancelled.")
                # Only a cancelled job's object may go: a superseded attempt shares
                # the deterministic key with the attempt that replaced it.
                get_storage().delete(bucket=job.tenant.bucket, key=key)
                if signed.sidecar is not None:
                    get_storage().delete(bucket=job.tenant.bucket, key=sidecar_key(key))
                return {"job_id": str(job.id), "status": "cancelled"}
            return {"job_id": str(job.id), "status": "superseded"}
        sink.finish()
        job.finished_at = finished_at
        job_finished(job=job, status=JobStatus.SUCCEEDED, attempt=claim.attempt, at=finished_at)
        if job.is_segment:
            through_outage(lambda: longform_segment_succeeded(segment=job))
        log.info(
            "job %s attempt %s: %.2f s of audio%s",
            job.id,
            claim.attempt,
            duration,
            " (engine started while the claim was on its way)" if early and early.served else "",
        )
        return {"job_id": str(job.id), "status": "succeeded"}
    except StorageError as exc:
        # Transient: the store may be back in a moment. Retry with backoff while
        # attempts remain; the output key is deterministic, so a retry is safe.
        if job_retry_later(claim=claim):
            log.warning("job %s: storage unavailable, retrying: %s", job.id, exc.message)
            return {"job_id": str(job.id), "status": "retrying"}
        # Only the attempt that owns the job speaks for it: a superseded one's
        # error must not end the stream its successor is making.
        if job_fail(claim=claim, code=exc.code, message=exc.message):
            sink.fail(code=exc.code, message=exc.message)
        return {"job_id": str(job.id), "status": "failed", "code": exc.code}
    except ChorusError as exc:
        if job_fail(claim=claim, code=exc.code, message=exc.message):
            sink.fail(code=exc.code, message=exc.message)
        return {"job_id": str(job.id), "status": "failed", "code": exc.code}
    except Exception:
        log.exception("job %s failed", job.id)
        message = (
            "Synthesis failed because of an internal error. "
            "Submit the job again; if it keeps failing, contact the operator."
        )
        if job_fail(claim=claim, code="internal_error", message=message):
            sink.fail(code="internal_error", message=message)
        return {"job_id": str(job.id), "status": "failed", "code": "internal_error"}


# How a realtime session runs once claimed (`synthesis.realtime.execution`, which
# registers it: it is built on this module's steps, and so cannot be imported here).
_session_run: list[Callable[..., dict[str, Any]]] = []


def register_session_run(run: Callable[..., dict[str, Any]]) -> None:
    _session_run[:] = [run]


def store_output(*, job: Job, engine: str, audio: EncodedAudio) -> tuple[str, SignedAudio]:
    """Sign the job's audio and store it (with its manifest) under its
    deterministic key, waiting out an outage of the store: the audio is in hand,
    and is not made again for one. The key, and the signed audio stored."""
    key = job_output_key(job_id=job.id, audio_format=job.format)
    signed = sign_job_output(
        data=audio.data,
        audio_format=job.format,
        job_id=str(job.id),
        tenant_id=job.tenant_id,
        limit_overrides=job.tenant.limit_overrides,
        engine=engine,
        segment=job.parent_id is not None,
    )
    # The sidecar goes first: audio marked as signed is never stored without
    # its manifest.
    if signed.sidecar is not None:
        put_patiently(
            get_storage(),
            bucket=job.tenant.bucket,
            key=sidecar_key(key),
            data=signed.sidecar,
            content_type=SIDECAR_CONTENT_TYPE,
            window_s=settings.STORAGE_RETRY_WINDOW_S,
        )
    put_patiently(
        get_storage(),
        bucket=job.tenant.bucket,
        key=key,
        data=signed.data,
        content_type=audio.content_type,
        window_s=settings.STORAGE_RETRY_WINDOW_S,
    )
    return key, signed


def _synthesize(
    *,
    claim: Claim,
    engine: Engine,
    prompts: VoicePromptCache,
    sink: ChunkSink,
    early: EarlyStart | None = None,
) -> np.ndarray | None:
    """All the job's audio, or None when the job stopped being ours (cancelled,
    or superseded by a newer attempt): checked at a chunk boundary at least
    every `OWNERSHIP_CHECK_S`. `early`: the engine started from the message,
    taken over if it makes exactly this job's audio."""
    job = claim.job
    voice = prepare_voice(claim=claim, engine=engine, prompts=prompts)
    chunks: list[np.ndarray] = []
    stream: Iterator[Samples]
    if early is not None and early.serves(job, voice):
        stream = early.chunks()
    else:
        if early is not None:
            early.close()  # first, so that this job never has two streams on the device
        stream = engine.synthesize(
            text=job.text, voice=voice, speed=job.speed, instruction=job.instruction
        )
    stamped = False  # first_audio_at
    checked = time.monotonic()  # when this attempt last saw it still owns the job
    try:
        for chunk in stream:
            if stamped and time.monotonic() - checked < OWNERSHIP_CHECK_S:
                # Chunks closer together than this go out unchecked: a query per
                # chunk was most of a fast engine's per-job cost. The final
                # UPDATE is conditional on ownership all the same.
                sink.chunk(chunk, engine.sample_rate)
            elif len(chunk) and not stamped:
                # The first audio goes out before the row is stamped: it is on the
                # way to a stream's first byte. Had this attempt lost the job
                # meanwhile, the stream ends with the cancellation, or the newer
                # attempt's audio takes over from the same point (chunks carry
                # their attempt; see `synthesis.api.streaming.job_events`).
                sink.chunk(chunk, engine.sample_rate)
                first_audio_at = through_outage(lambda: _owned_stamp(claim, "first_audio_at"))
                if first_audio_at is None:
                    return None
                checked = time.monotonic()
                job.first_audio_at = first_audio_at
                job_first_audio(job=job, at=first_audio_at)
                stamped = True
            elif through_outage(owned_rows(claim).exists):
                checked = time.monotonic()
                sink.chunk(chunk, engine.sample_rate)
            else:
                return None
            chunks.append(chunk)
    finally:
        close_stream(stream)
    samples = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)
    if samples.size == 0:
        raise EngineError("The engine produced no audio for this text.")
    return samples


# How often a running job looks whether it was cancelled or superseded (at the
# first chunk boundary past this many seconds since it last looked): a
# cancellation stops the engine within this time plus one chunk.
OWNERSHIP_CHECK_S = 0.25


def owned_rows(claim: Claim) -> Any:
    """Rows this attempt may still write: a newer attempt supersedes an older one."""
    return Job.objects.filter(pk=claim.job.pk, attempts=claim.attempt, status=JobStatus.RUNNING)


def _owned_update(claim: Claim, **values: Any) -> int:
    """`owned_rows(claim).update(**values)`, in written-out SQL (see `synthesis.job_rows`)."""
    return job_row_update_owned(job_id=claim.job.pk, attempt=claim.attempt, **values)


def _owned_stamp(
    claim: Claim, stamp: str, *, event: Event | None = None, **values: Any
) -> datetime | None:
    """`_owned_update`, with the field `stamp` set to the database's time (and the
    job moved by `event`): the time written, or None when this attempt no longer
    owns the job."""
    return job_row_stamp_owned(
        job_id=claim.job.pk, attempt=claim.attempt, stamp=stamp, event=event, **values
    )


def succeed(claim: Claim, *, spoken: int | None = None, **values: Any) -> datetime | None:
    """Mark the job succeeded and charge it, together, if this attempt still owns
    it: the time written, or None. Safe to run again after an error: a commit
    whose answer was lost with its connection left the job succeeded by this
    attempt (no other may write it), and that is this call's success. `spoken`:
    a realtime session's characters sent to its engine, charged out of its
    reservation (the rest is released)."""
    with transaction.atomic():
        finished_at = _owned_stamp(claim, "finished_at", event=Event.SUCCEEDED, **values)
        if finished_at is not None:
            if spoken is None:
                quota_commit(job_id=claim.job.pk)
            else:
                quota_commit_spoken(job_id=claim.job.pk, characters=spoken)
            return finished_at
    done = Job.objects.filter(
        pk=claim.job.pk, attempts=claim.attempt, status=JobStatus.SUCCEEDED
    ).values_list("finished_at", flat=True)
    return done.first()


def job_retry_later(*, claim: Claim) -> bool:
    """Put the job back in its queue after a backoff, if attempts remain."""
    if claim.attempt >= MAX_ATTEMPTS:
        return False
    requeued = through_outage(
        lambda: job_transition(
            event=Event.RETRIED, job_id=claim.job.pk, where=Q(attempts=claim.attempt)
        )
    )
    if not requeued:
        return False
    job_requeued(job=claim.job, reason="storage_retry", attempt=claim.attempt)
    return job_publish(job=claim.job, countdown=retry_delay(claim.attempt))


def job_fail(*, claim: Claim, code: str, message: str) -> bool:
    """Fail the job and refund it, together, if this attempt still owns it."""
    failed_at = through_outage(lambda: _fail(claim, code=code, message=message))
    failed = failed_at is not None
    if failed:
        job_finished(
            job=claim.job, status=JobStatus.FAILED, code=code, attempt=claim.attempt, at=failed_at
        )
        if claim.job.is_segment:
            through_outage(
                lambda: longform_segment_failed(segment_id=claim.job.pk, code=code, message=message)
            )
    return bool(failed)


def _fail(claim: Claim, *, code: str, message: str) -> datetime | None:
    with transaction.atomic():
        failed_at = _owned_stamp(
            claim, "finished_at", event=Event.FAILED, error_code=code, error_message=message
        )
        if failed_at is not None:
            quota_refund(job_id=claim.job.pk)
    return failed_at


def why_stopped(job: Job) -> str:
    cancelled = Job.objects.filter(pk=job.pk, status=JobStatus.CANCELLED).exists()
    return "cancelled" if cancelled else "superseded"


def prepare_voice(
    *, claim: Claim, engine: Engine, prompts: VoicePromptCache
) -> PreparedVoice | None:
    """The job's prepared voice prompt, from memory, storage or computed, and
    recorded on the job with the time it took."""
    job = claim.job
    voice = through_outage(lambda: job.voice)
    if voice is None:
        if job.voice_name:
            raise _voice_deleted(job.voice_name)
        return None
    storage = get_storage()
    bucket = job.tenant.bucket
    prompt_key = voice_prompt_key(voice_id=voice.id, version=voice.version, engine=engine.name)

    def load_reference() -> ReferenceAudio:
        try:
            data = storage.get(bucket=bucket, key=voice.audio_key)
        except NotFound:  # deleted after this job loaded its row
            raise _voice_deleted(voice.name) from None
        decoded = decode_reference(
            data,
            max_bytes=_REFERENCE_READ_LIMIT,
            min_seconds=0.0,
            max_seconds=3600.0,
            min_sample_rate=1,
        )
        return decoded.to_reference(transcript=voice.transcript, language=voice.language)

    def load_stored() -> bytes | None:
        try:
            return storage.get(bucket=bucket, key=prompt_key)
        except NotFound:
            return None

    def store(data: bytes) -> None:
        storage.put(
            bucket=bucket, key=prompt_key, data=data, content_type="application/octet-stream"
        )

    prepared, source, seconds = prompts.get_or_prepare(
        tenant_id=job.tenant_id,
        voice_id=voice.id,
        version=voice.version,
        engine=engine,
        load_reference=load_reference,
        load_stored=load_stored,
        store=store,
    )
    through_outage(
        lambda: _owned_update(claim, prompt_source=source, prompt_seconds=round(seconds, 4))
    )
    return prepared


def _voice_deleted(name: str) -> EngineError:
    return EngineError(
        f"The voice '{name}' was deleted before this job ran. "
        "Submit the job again with an existing voice."
    )
