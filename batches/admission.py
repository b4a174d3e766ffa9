"""A batch's items admitted together: built before the lock, written in bulk.

Admitted one by one (`job_create` per item: its own lock, line and period
reads, INSERTs and log line) a 5,000-item batch held the tenant's lock for
half a minute, and on SQLite, where a write transaction holds the database's
one write lock from its start, every other tenant's writes with it. Here the
items' rows are built and converted for the database first, outside any
transaction (`batch_items_prepare`: most of the work, Python's); the
transaction then checks the whole batch against the tenant's line and month
once and sends the rows as multi-row INSERTs (`batch_items_admit`).
`bench/batch_admission.py` measures it.

Each item is still an ordinary job: reserved on its own in the ledger (and so
committed or refunded on its own), `queued` while the tenant has broker slots
and `pending` after that, released in submitted order, published after commit.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Model

from batches.models import Batch, BatchItem
from chorus.errors import NotFound
from chorus.statements import insert_many
from quotas.plans import tenant_limits
from quotas.services import quota_admit, quota_period_read, quota_reserve_many
from synthesis.job_events import job_admitted
from synthesis.line_counts import line_statement
from synthesis.models import Job, JobStatus, Voice
from synthesis.services.dispatch import (
    admission_slots,
    created_dispatch_fields,
    job_publish_created,
    tenant_line_from,
)
from tenants.locks import tenant_lock_then
from tenants.models import ApiKey, Tenant

if TYPE_CHECKING:
    from batches.services import ItemSpec


@dataclass(frozen=True)
class PreparedItems:
    """A batch's items as rows ready to send: every job `pending` (the first
    ones are queued under the lock, where the tenant's free slots are known)."""

    indexes: list[int]
    specs: list[ItemSpec]
    jobs: list[Job]
    job_rows: list[dict[str, Any]]
    characters: int


def batch_items_prepare(
    *, tenant: Tenant, api_key: ApiKey | None, items: Sequence[tuple[int, ItemSpec]], priority: str
) -> PreparedItems:
    """The items' (index, spec) jobs, built and converted for the database;
    call before the batch's transaction."""
    voices = _voices(tenant=tenant, items=items)
    jobs = [
        Job(
            id=uuid.uuid4(),
            tenant=tenant,
            api_key=api_key,
            priority=priority,
            **created_dispatch_fields(queued=False),
            **_job_fields(tenant=tenant, spec=spec, voice=voices.get(spec.speech.voice_id)),
        )
        for _, spec in items
    ]
    return PreparedItems(
        indexes=[index for index, _ in items],
        specs=[spec for _, spec in items],
        jobs=jobs,
        # Each row's created_at is stamped here, in submitted order: held-back
        # items are released oldest first, so in this order.
        job_rows=[_row(job) for job in jobs],
        characters=sum(len(spec.speech.text) for _, spec in items),
    )


def batch_items_admit(
    *, tenant: Tenant, batch: Batch, prepared: PreparedItems, priority: str
) -> list[Job]:
    """Admit, charge (reserve) and hold or queue the prepared items in the
    caller's transaction, which has created `batch`; published once it commits.
    A refusal here (the month's characters went meanwhile) refuses every item."""
    assert transaction.get_connection().in_atomic_block
    jobs = prepared.jobs
    if not jobs:
        return []
    # Lock order everywhere: tenant, then its usage period.
    period_read = quota_period_read(tenant=tenant)
    line_rows, period_rows = tenant_lock_then(
        tenant.pk,
        [
            line_statement(
                tenant_id=tenant.pk, priority=priority, slots=settings.TENANT_BROKER_SLOTS
            ),
            period_read.statement,
        ],
    )
    period = quota_admit(
        tenant=tenant,
        limits=tenant_limits(tenant),
        characters=prepared.characters,
        in_flight=0,  # items do not count against the plan's jobs at once
        period_read=period_read.with_rows(period_rows),
    )
    _voices(tenant=tenant, items=list(zip(prepared.indexes, prepared.specs, strict=True)))
    # The tenant's free broker slots go to the first items; the rest wait.
    job_rows = list(prepared.job_rows)
    for n in range(min(admission_slots(line=tenant_line_from(line_rows)), len(jobs))):
        for name, value in created_dispatch_fields(queued=True).items():
            setattr(jobs[n], name, value)
        job_rows[n] = {**job_rows[n], **_row(jobs[n], names=("status", "epoch", "published_at"))}
    insert_many(Job, job_rows)
    quota_reserve_many(period=period, reservations=[(job.pk, job.characters) for job in jobs])
    insert_many(
        BatchItem,
        [
            {
                "batch_id": _prep(BatchItem, "batch", batch.pk),
                "index": index,
                "custom_id": spec.custom_id,
                "metadata": _prep(BatchItem, "metadata", spec.metadata),
                "job_id": row["id"],
            }
            for index, spec, row in zip(prepared.indexes, prepared.specs, job_rows, strict=True)
        ],
    )
    # Published only once the rows are committed, or a fast worker could look
    # for a job that does not exist yet. A publish that fails fails that item
    # and refunds it (`dispatch._send`), as for a single job.
    transaction.on_commit(lambda: _published(jobs))
    return jobs


def _published(jobs: list[Job]) -> None:
    for job in jobs:
        job._state.adding = False
        job._state.db = connection.alias
        if job.status == JobStatus.QUEUED:
            job_publish_created(job=job)
    for job in jobs:
        job_admitted(job=job)


def _voices(
    *, tenant: Tenant, items: Sequence[tuple[int, ItemSpec]]
) -> dict[uuid.UUID | None, Voice]:
    """The items' voices. The checks found each of them; one deleted since
    refuses the batch, as it would have then."""
    ids = {spec.speech.voice_id for _, spec in items if spec.speech.voice_id is not None}
    voices: dict[uuid.UUID | None, Voice] = {
        voice.pk: voice for voice in Voice.objects.filter(tenant=tenant, pk__in=ids)
    }
    for index, spec in items:
        voice_id = spec.speech.voice_id
        if voice_id is not None and voice_id not in voices:
            raise NotFound(
                f"Item {index}: No voice with this id.",
                details={"index": index, "field": "voice_id", "voice_id": str(voice_id)},
            )
    return voices


def _job_fields(*, tenant: Tenant, spec: ItemSpec, voice: Voice | None) -> dict[str, Any]:
    """An item's job as `job_create` writes a batch's item."""
    speech = spec.speech
    return dict(
        **speech.job_fields(),
        voice=voice,
        voice_name=voice.name if voice else "",
        reuse_key=speech.reuse_key(tenant_id=tenant.pk, engine=settings.ENGINE, voice=voice),
        in_batch=True,
    )


def _row(instance: Model, *, names: Sequence[str] = ()) -> dict[str, Any]:
    """The instance's columns (or those `names`) as an INSERT sends them, with
    `save()`'s conversions (`auto_now_add` stamps now)."""
    return {
        f.attname: f.get_db_prep_save(f.pre_save(instance, True), connection)
        for f in instance._meta.local_concrete_fields
        if not names or f.attname in names
    }


def _prep(model: type[Model], name: str, value: Any) -> Any:
    field = model._meta.get_field(name)
    return field.get_db_prep_save(value, connection)  # type: ignore[union-attr]
