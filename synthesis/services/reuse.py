"""Result reuse: a job asking for exactly what an earlier job of the same tenant
produced is answered at once with a copy of that audio, and no GPU work.

"Exactly" is the reuse key (`SpeechRequest.reuse_key`): tenant, engine, voice
and its version, text, format, sample rate, speed and instruction.
Deterministic engines (espeak, synthetic) reuse by default; a sampling engine
(cosyvoice2) speaks differently each time, so only a request that asks
(`"reuse": true`) gets an earlier take.

The new job gets its own object, a server-side copy inside the tenant's bucket:
deleting or expiring either job never breaks the other's link, and storage
accounting stays one object per job. Characters are charged as for a new job.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from chorus.errors import NotFound
from chorus.statements import Rows, Statement
from quotas.plans import Limits
from quotas.services import quota_admit, quota_commit, quota_reserve
from synthesis.engines import engine_class
from synthesis.job_lifecycle import Event, created_status
from synthesis.models import Job, JobStatus
from synthesis.selectors import jobs_in_flight
from synthesis.storage_runtime import get_storage
from tenants.locks import tenant_lock
from tenants.models import Tenant


def reuse_wanted(*, asked: bool | None, stream: bool) -> bool:
    """Whether to look for an earlier result. `asked`: True (yes, whatever the
    engine), False (never: a fresh run), None (where the engine is deterministic).
    A live stream is made as it plays, so it is never answered from storage;
    `CHORUS_RESULT_REUSE=false` turns reuse off (benchmarks of the workers)."""
    if stream or asked is False or not settings.RESULT_REUSE:
        return False
    return asked is True or engine_class(settings.ENGINE).deterministic


def reuse_probe(*, tenant: Tenant, key: str) -> Statement:
    """The look for the tenant's latest success with this key whose audio is
    still kept, for `reuse_source`.

    Asked on every submit to a deterministic engine and nearly always empty, so
    it costs as little as a look can: written out (off the partial index
    `job_reuse`, the id only; the ORM's query took a third of the submit's CPU to
    build), prepared, and sent in the round trip that takes the tenant's lock.
    """
    return Statement(_REUSE_PROBE, [tenant.pk, key, settings.ENGINE], "reuse_probe")


def reuse_source(rows: Rows | None) -> Job | None:
    """The job `reuse_probe` found, read whole; None when it found none."""
    return Job.objects.filter(pk=rows[0][0]).first() if rows else None


_REUSE_PROBE = f"""
    SELECT id FROM {Job._meta.db_table}
    WHERE tenant_id = %s AND reuse_key = %s AND engine = %s
      AND status = '{JobStatus.SUCCEEDED.value}' AND output_deleted_at IS NULL
      AND reuse_key <> '' AND output_key <> ''
    ORDER BY finished_at DESC
    LIMIT 1
"""


@dataclass(frozen=True)
class CopiedResult:
    """An earlier result's audio copied to a new job's own object, before the job
    exists: the copy is network I/O, so it is made outside any lock."""

    source: Job
    job_id: uuid.UUID
    output_key: str


def reuse_copy(
    *, tenant: Tenant, source: Job, output_key: Callable[[uuid.UUID], str]
) -> CopiedResult | None:
    """Copy `source`'s audio for a new job; None when it went meanwhile (expired).
    Copied before the row exists: no link is ever given for a missing object."""
    job_id = uuid.uuid4()
    key = output_key(job_id)
    try:
        get_storage().copy(bucket=tenant.bucket, source_key=source.output_key, key=key)
    except NotFound:
        return None
    return CopiedResult(source=source, job_id=job_id, output_key=key)


def job_create_reused(
    *,
    copied: CopiedResult,
    limits: Limits,
    remember: Callable[[Job], None],
    **fields: Any,
) -> Job:
    """A succeeded job answering from the copied audio: admitted, charged and
    finished together. (The caller deletes the copy if this refuses.)"""
    tenant: Tenant = fields["tenant"]
    source = copied.source
    with transaction.atomic():
        tenant_lock(tenant.pk)
        period = quota_admit(
            tenant=tenant,
            limits=limits,
            characters=len(fields["text"]),
            in_flight=jobs_in_flight(tenant=tenant),
        )
        now = timezone.now()
        job = Job.objects.create(
            id=copied.job_id,
            status=created_status(Event.REUSED),
            characters=len(fields["text"]),
            engine=source.engine,
            output_key=copied.output_key,
            output_bytes=source.output_bytes,
            sample_rate=source.sample_rate,
            duration_s=source.duration_s,
            reused_from=source,
            started_at=now,
            first_audio_at=now,
            finished_at=now,
            **fields,
        )
        quota_reserve(period=period, job_id=job.id, characters=job.characters)
        quota_commit(job_id=job.id)
        remember(job)
    return job
