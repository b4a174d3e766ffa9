"""Submitting speech jobs (web tier). The worker side lives in `execution.py`."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from datetime import datetime, timedelta
from typing import Any

import redis
from django.conf import settings
from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from chorus.disk_wait import commit_unflushed, wait_for_disk
from chorus.errors import ChorusError, InstructionNotSupported, NotFound
from chorus.health import check_broker
from chorus.redis_client import get_redis, redis_answered_lately
from chorus.statements import (
    Statement,
    execute_and_commit,
    execute_together,
    insert_statement,
    inserted,
)
from quotas.limits import limits_check_priority, limits_check_text
from quotas.plans import Limits, tenant_limits
from quotas.services import (
    quota_admit,
    quota_period_read,
    quota_refund,
    quota_reserve,
    quota_reserve_statements,
)
from synthesis.audio_out import FILE_EXTENSIONS, check_output
from synthesis.engines import engine_class
from synthesis.engines.cosyvoice2_input import cosyvoice2_check_request
from synthesis.job_events import job_admitted, job_finished
from synthesis.job_lifecycle import Event, job_transition
from synthesis.line_counts import line_statement
from synthesis.longform.lifecycle import longform_cancel, longform_fail
from synthesis.longform.submit import LongformPlan, longform_create, longform_plan
from synthesis.models import IdempotencyKey, Job, JobStatus, Voice
from synthesis.provenance import sidecar_key
from synthesis.services.dispatch import (
    QUEUE_UNAVAILABLE,
    admission_refill,
    admission_slots,
    created_dispatch_fields,
    job_publish_before_commit,
    job_publish_created,
    job_publish_sent,
    tenant_line_from,
)
from synthesis.services.reuse import (
    CopiedResult,
    job_create_reused,
    reuse_copy,
    reuse_probe,
    reuse_source,
    reuse_wanted,
)
from synthesis.speech_request import SpeechRequest
from synthesis.storage_runtime import get_storage
from synthesis.streaming import stream_announce_end
from synthesis.text_check import speech_text_check
from tenants.locks import tenant_lock_then
from tenants.models import ApiKey, Tenant

log = logging.getLogger(__name__)


class JobUnconfirmed(ChorusError):
    """The job was committed and published, but the database failed while Chorus
    waited for it to reach the disk (`chorus.disk_wait`): it most likely stands,
    and may run; the client should look before it submits again."""

    status = 503
    code = "job_unconfirmed"

    def __init__(self, job_id: uuid.UUID) -> None:
        super().__init__(
            "The job was accepted, but the database could not confirm that it is saved. "
            f"Read GET /v1/speech/{job_id} before you submit it again.",
            details={"job_id": str(job_id)},
            headers={"Retry-After": "5"},
        )


class QueueUnavailable(ChorusError):
    status = 503
    code = QUEUE_UNAVAILABLE

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        # A broker restart takes seconds: say when to try again.
        super().__init__(message, details=details, headers={"Retry-After": "5"})


class IdempotencyKeyReused(ChorusError):
    status = 409
    code = "idempotency_key_reused"


# How long an Idempotency-Key answers with its job.
IDEMPOTENCY_TTL = timedelta(hours=24)


def job_output_key(*, job_id: uuid.UUID, audio_format: str) -> str:
    # Deterministic: a redelivered task overwrites its own object, never another's.
    return f"speech/{job_id}.{FILE_EXTENSIONS[audio_format]}"


def job_create(
    *,
    tenant: Tenant,
    api_key: ApiKey | None,
    speech: SpeechRequest,
    priority: str = "normal",
    idempotency_key: str = "",
    in_batch: bool = False,
    copied: CopiedResult | None = None,
) -> Job:
    """Admit, charge (reserve) and dispatch a speech job.

    `speech` is what is asked; who asks and in which queue come with it. With an
    `idempotency_key`, the same key and request give the same job (for 24
    hours); the same key with a different request is refused (409).

    `speech.reuse`: True takes an earlier identical result even from a sampling
    engine, False never does, None (default) where the engine is deterministic
    (`synthesis.services.reuse`). A job `in_batch` is not counted against the
    plan's jobs at once: the batch's own limits bound it; nor does it look for an
    earlier result: the batch did, and passes the copy it made as `copied`.
    """
    for _ in range(2):
        try:
            return _job_create(
                tenant=tenant,
                api_key=api_key,
                speech=speech,
                priority=priority,
                idempotency_key=idempotency_key,
                in_batch=in_batch,
                copied=copied,
            )
        except _KeyTaken:
            # A parallel request with this key committed first: the second pass
            # finds its job and answers with it (or 409 if it asked otherwise).
            continue
    raise AssertionError("unreachable: an idempotency key taken twice")


def _job_create(
    *,
    tenant: Tenant,
    api_key: ApiKey | None,
    speech: SpeechRequest,
    priority: str,
    idempotency_key: str,
    in_batch: bool,
    copied: CopiedResult | None,
) -> Job:
    text = speech.text
    limits = tenant_limits(tenant)
    # A text over the one-job limit becomes a long-form job (`synthesis.longform`).
    longform = longform_plan(limits=limits, text=text, language=speech.language)
    if longform is None:
        limits_check_text(limits=limits, text=text)
    limits_check_priority(limits=limits, priority=priority)
    check_output(speech.format, speech.sample_rate)  # refused now, not found by the worker
    voice = voice_for(tenant=tenant, voice_id=speech.voice_id)
    job_check_for_engine(text=text, voice=voice, instruction=speech.instruction)
    fingerprint = speech.fingerprint(priority=priority)
    if idempotency_key:
        earlier = _job_for_key(tenant=tenant, key=idempotency_key, fingerprint=fingerprint)
        if earlier is not None:
            # A parallel request may have just committed it, not yet on disk: this
            # answer waits for the disk as that one's does.
            wait_for_disk()
            return earlier
    if speech.stream and not _streams_reachable():
        # Its audio would travel through Redis: answering 200 and then cutting the
        # body is worse than refusing now, before anything is charged.
        raise QueueUnavailable(
            "Live streaming is unavailable right now; nothing was charged. Try again "
            "shortly, or submit without stream and fetch the file."
        )
    fields = dict(
        **speech.job_fields(),
        api_key=api_key,
        voice=voice,
        voice_name=voice.name if voice else "",
        priority=priority,
        reuse_key=speech.reuse_key(tenant_id=tenant.pk, engine=settings.ENGINE, voice=voice),
        in_batch=in_batch,
    )

    def remember(job: Job) -> None:
        _remember_key(tenant, idempotency_key, fingerprint, job)

    def output_key(job_id: uuid.UUID) -> str:
        return job_output_key(job_id=job_id, audio_format=speech.format)

    def admit(*, look_for_reuse: bool) -> Job:
        return job_admit(
            tenant=tenant,
            limits=limits,
            longform=longform,
            fields=fields,
            in_batch=in_batch,
            remember=remember if idempotency_key else None,
            look_for_reuse=look_for_reuse,
        )

    # Result reuse, the one hook: an earlier identical result answers at once.
    # A batch looks for its items' earlier results before its transaction
    # (`job_copy_earlier_result`): a copy is network I/O, and the batch holds the
    # tenant's lock from its first item to its commit.
    if copied is None and not in_batch and reuse_wanted(asked=speech.reuse, stream=speech.stream):
        try:
            return admit(look_for_reuse=True)
        except _Reusable as found:
            copied = reuse_copy(tenant=tenant, source=found.source, output_key=output_key)
    if copied is None:  # nothing to reuse, or its audio went meanwhile: a fresh run
        return admit(look_for_reuse=False)
    try:
        reused = job_create_reused(
            copied=copied,
            limits=limits,
            remember=remember,
            tenant=tenant,
            # The reused job records what it always did: its characters are set
            # there, and neither stream nor language.
            **{k: v for k, v in fields.items() if k not in ("characters", "stream", "language")},
        )
    except BaseException:
        if not in_batch:  # a refused batch deletes its copies itself
            get_storage().delete(bucket=tenant.bucket, key=copied.output_key)
        raise
    job_admitted(job=reused)
    job_finished(job=reused, status=JobStatus.SUCCEEDED)
    return reused


def job_copy_earlier_result(*, tenant: Tenant, speech: SpeechRequest) -> CopiedResult | None:
    """For a batch's item, before the batch's transaction: the tenant's earlier
    result for exactly this request, copied for the item's job (`job_create(copied=)`);
    None when there is none to reuse."""
    if not reuse_wanted(asked=speech.reuse, stream=False):
        return None
    voice = voice_for(tenant=tenant, voice_id=speech.voice_id)
    key = speech.reuse_key(tenant_id=tenant.pk, engine=settings.ENGINE, voice=voice)
    [rows] = execute_together([reuse_probe(tenant=tenant, key=key)])
    source = reuse_source(rows)
    if source is None:
        return None
    return reuse_copy(
        tenant=tenant,
        source=source,
        output_key=lambda job_id: job_output_key(job_id=job_id, audio_format=speech.format),
    )


class _Reusable(Exception):
    """The reuse probe found an earlier result: the admission's transaction is
    left (it has written nothing) so that the copy of its audio, network I/O,
    runs outside the tenant's lock."""

    def __init__(self, source: Job) -> None:
        self.source = source


def job_admit(
    *,
    tenant: Tenant,
    limits: Limits,
    fields: dict[str, Any],
    longform: LongformPlan | None = None,
    in_batch: bool = False,
    remember: Callable[[Job], None] | None = None,
    look_for_reuse: bool = False,
    under_lock: Callable[[], None] | None = None,
) -> Job:
    """Admit, charge (reserve) and dispatch the job: one transaction under the
    tenant's lock. `look_for_reuse`: first look for an earlier identical result
    (`_Reusable` when there is one). `under_lock`: a further check of the
    tenant's admission (a realtime session's count), made holding the lock."""
    priority: str = fields["priority"]
    outcome: list[bool] = []
    sending: Future[None] | None = None  # the first message, sent before the commit
    unflushed: list[Statement] = []
    with transaction.atomic():
        # Lock order everywhere: tenant, then its usage period. The lock, the
        # tenant's line, the locked period and the reuse probe are one round trip
        # on PostgreSQL.
        period_read = quota_period_read(tenant=tenant)
        line_read = line_statement(
            tenant_id=tenant.pk, priority=priority, slots=settings.TENANT_BROKER_SLOTS
        )
        reads = [line_read, period_read.statement]
        if look_for_reuse:
            reads.append(reuse_probe(tenant=tenant, key=fields["reuse_key"]))
        line_rows, period_rows, *probe_rows = tenant_lock_then(tenant.pk, reads)
        if probe_rows and (source := reuse_source(probe_rows[0])) is not None:
            raise _Reusable(source)
        if under_lock is not None:
            under_lock()
        line = tenant_line_from(line_rows)
        period = quota_admit(
            tenant=tenant,
            limits=limits,
            characters=fields["characters"],
            in_flight=0 if in_batch else line.in_flight,
            period_read=period_read.with_rows(period_rows),
        )
        if longform is not None:
            job = longform_create(
                tenant=tenant,
                plan=longform,
                fields=fields,
                broker_slots=admission_slots(line=line),
                on_publish_failed=lambda parent: outcome.append(_longform_unpublished(parent)),
            )
            quota_reserve(period=period, job_id=job.id, characters=job.characters)
        else:
            job = Job(
                tenant=tenant,
                **created_dispatch_fields(queued=admission_slots(line=line) > 0),
                **fields,
            )
            if job.status == JobStatus.QUEUED:
                sending = job_publish_before_commit(job=job)
            # The row and its reservation: one round trip on PostgreSQL.
            reserve = quota_reserve_statements(
                period=period, job_id=job.id, characters=job.characters
            )
            # Visible to the workers as soon as it commits; on disk before the
            # answer (`chorus.disk_wait`).
            unflushed = commit_unflushed()
            # The row, its reservation and, when nothing is written after them
            # (no Idempotency-Key to remember), the commit: one round trip.
            statements = [insert_statement(job), *reserve, *unflushed]
            if remember is None:
                execute_and_commit(statements)
            else:
                execute_together(statements)
            inserted(job)
        if remember is not None:
            remember(job)
        if job.status == JobStatus.QUEUED and sending is None:
            # Publish only once the row is committed, or a fast worker could look
            # for a job that does not exist yet.
            transaction.on_commit(lambda: outcome.append(job_publish_created(job=job)))
        # A job held back `pending` (or a long text's segment 0) needs no look of
        # its own once committed: a claim that frees a slot while this lock is
        # held waits for it and releases the job (`dispatch._may_release`).
    if sending is not None:  # sent before the commit (its end, if it outlasted the wait)
        outcome.append(job_publish_sent(job=job, sending=sending))
    if unflushed:  # committed and published: now the disk, before the answer
        try:
            wait_for_disk()
        except DatabaseError as error:
            raise JobUnconfirmed(job.id) from error
    if outcome == [False]:  # published right after commit, and it failed
        raise QueueUnavailable(
            "The job queue is unavailable right now; nothing was charged. Try again shortly.",
            details={"job_id": str(job.id)},
        )
    job_admitted(job=job)
    return job


def _longform_unpublished(parent: Job) -> bool:
    """A long-form job whose first segments could not reach the broker: failed
    and refunded, like a job whose publish failed."""
    longform_fail(
        parent_id=parent.pk, code=QUEUE_UNAVAILABLE, message="the job queue was unavailable."
    )
    IdempotencyKey.objects.filter(job_id=parent.pk).delete()
    return False


def _streams_reachable() -> bool:
    client = get_redis()
    if client is not None and redis_answered_lately(client):
        return True  # the rate limiter's call, in this request: no PING more
    try:
        check_broker()  # the streams live in the broker's Redis
    except (ConnectionError, redis.RedisError):
        return False
    return True


def job_check_for_engine(*, text: str, voice: Voice | None, instruction: str) -> None:
    """Refuse now what the workers' engine would fail on, before anything is charged.

    CHORUS_ENGINE names the workers' engine; the web tier reads the same setting.
    """
    if instruction.strip() and not engine_class(settings.ENGINE).follows_instructions:
        raise InstructionNotSupported(
            f"The {settings.ENGINE} engine cannot follow an instruction; send the request "
            "without one (only cosyvoice2's instruct mode changes the speech with it).",
            details={"engine": settings.ENGINE, "field": "instruction"},
        )
    if settings.ENGINE == "cosyvoice2":
        cosyvoice2_check_request(text=text, has_voice=voice is not None, instruction=instruction)
    speech_text_check(text=text, instruction=instruction)  # every engine


class _KeyTaken(Exception):
    pass


def _remember_key(tenant: Tenant, key: str, fingerprint: str, job: Job) -> None:
    if not key:
        return
    try:
        with transaction.atomic():
            IdempotencyKey.objects.create(tenant=tenant, key=key, fingerprint=fingerprint, job=job)
    except IntegrityError:  # a parallel request with this key won the race
        raise _KeyTaken() from None


def _job_for_key(*, tenant: Tenant, key: str, fingerprint: str) -> Job | None:
    """The job an earlier request with this key made, if it asked for the same."""
    earlier = IdempotencyKey.objects.filter(tenant=tenant, key=key).select_related("job").first()
    if earlier is None:
        return None
    if earlier.created_at < timezone.now() - IDEMPOTENCY_TTL:
        earlier.delete()  # expired; the sweeper had not got to it yet
        return None
    if earlier.fingerprint != fingerprint:
        raise IdempotencyKeyReused(
            "This Idempotency-Key was used with a different request. Use a new key.",
            details={"idempotency_key": key, "job_id": str(earlier.job_id)},
        )
    return earlier.job


def voice_for(*, tenant: Tenant, voice_id: uuid.UUID | None) -> Voice | None:
    """The tenant's voice of this id (None: the engine's default voice); another
    tenant's is not found."""
    if voice_id is None:
        return None
    voice = Voice.objects.filter(tenant=tenant, pk=voice_id).first()
    if voice is None:
        raise NotFound("No voice with this id.", details={"voice_id": str(voice_id)})
    return voice


class JobNotCancellable(ChorusError):
    status = 409
    code = "job_not_cancellable"


def job_cancel(*, tenant: Tenant, job: Job) -> Job:
    """Stop a queued or running job and refund it, together.

    A queued job never starts (the worker's claim skips it); a running one stops
    at a chunk boundary within a quarter second (`OWNERSHIP_CHECK_S`; at its next
    chunk when chunks come slower) and its audio is discarded.
    """
    if job.is_longform:
        if not longform_cancel(parent=job):
            job.refresh_from_db()
            if job.status == JobStatus.RUNNING:  # every segment is done: being joined
                raise JobNotCancellable(
                    "Every segment of this long text is made: its file is being joined and "
                    "will be delivered (and charged as a finished job). It can no longer be "
                    "cancelled.",
                    details={"status": job.status, "joining": True},
                )
            raise _not_cancellable(job)
        job.refresh_from_db()
        return job
    with transaction.atomic():
        cancelled = job_transition(
            event=Event.CANCELLED,
            job_id=job.pk,
            where=Q(tenant=tenant),
            error_code="cancelled",
            error_message="The job was cancelled at your request; nothing was charged.",
            finished_at=timezone.now(),
        )
        if cancelled:
            quota_refund(job_id=job.pk)
    job.refresh_from_db()
    if cancelled:
        job_finished(job=job, status=JobStatus.CANCELLED, code="cancelled")
        if job.stream:
            stream_announce_end(job_id=job.pk, code="cancelled", message=job.error_message)
        admission_refill(tenant_id=tenant.pk, priority=job.priority)
    if not cancelled:
        raise _not_cancellable(job)
    return job


def _not_cancellable(job: Job) -> JobNotCancellable:
    return JobNotCancellable(
        f"The job has already {job.status}; only queued or running jobs can be cancelled.",
        details={"status": job.status},
    )


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


def job_provenance(*, job: Job) -> dict[str, Any] | None:
    """Where the job's audio keeps its Content Credentials: {"embedded": true}, or
    a signed link to its sidecar manifest (`<key>.c2pa`); None while there is no
    audio, or when it is unsigned."""
    if job.status != JobStatus.SUCCEEDED or not job.output_key or job.output_deleted_at:
        return None
    if job.provenance == "embedded":
        return {"embedded": True}
    if job.provenance != "sidecar":
        return None
    ttl = tenant_limits(job.tenant).link_ttl_seconds
    url = get_storage().signed_url(
        bucket=job.tenant.bucket,
        key=sidecar_key(job.output_key),
        expires_in=ttl,
        filename=f"{job.id}.c2pa",
    )
    return {"embedded": False, "sidecar_url": url}
