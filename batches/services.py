"""Creating and ending batches (cancelling one: `batches.cancelling`). Each item
is an ordinary speech job (`synthesis.services.jobs.job_create`): charged,
admitted fairly, run, refunded and cancelled as a single job is. The batch adds
all-or-nothing admission, a manifest and, once every item has ended, one archive
of the audio."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from batches.admission import batch_items_admit, batch_items_prepare
from batches.ending import batch_ended
from batches.errors import BatchTooLarge
from batches.models import Batch, BatchItem, BatchStatus
from chorus.errors import ChorusError, NotFound
from quotas.errors import QuotaExceeded
from quotas.limits import limits_check_priority, limits_check_text
from quotas.plans import tenant_batch_limits, tenant_limits
from quotas.services import usage_period_current
from synthesis.audio_out import OUTPUT_FORMATS, UnsupportedOutput, check_output
from synthesis.models import IN_FLIGHT, Job, JobStatus, Voice
from synthesis.services.jobs import (
    IDEMPOTENCY_TTL,
    IdempotencyKeyReused,
    job_check_for_engine,
    job_copy_earlier_result,
    job_create,
)
from synthesis.services.reuse import CopiedResult
from synthesis.speech_request import SpeechRequest, fingerprint_of
from synthesis.storage_runtime import get_storage
from tenants.models import ApiKey, Tenant

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ItemSpec:
    """A batch's item: what it asks to be spoken, and what the batch keeps of it."""

    speech: SpeechRequest
    custom_id: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


def batch_fingerprint(*, priority: str, items: list[ItemSpec]) -> str:
    """What a batch's Idempotency-Key remembers of it."""
    return fingerprint_of(
        priority,
        *(
            {
                **item.speech.batch_item_fields(),
                "custom_id": item.custom_id,
                "metadata": item.metadata,
            }
            for item in items
        ),
    )


# The item field each submit-time error is about, for the 400's details.
_FIELD_OF = {
    "text_too_long": "text",
    "unsupported_text": "text",
    "voice_required": "voice_id",
    "not_found": "voice_id",
    "instruction_not_supported": "instruction",
    "unsupported_output": "format",
}


@contextmanager
def item_errors(index: int) -> Iterator[None]:
    """Say which item an error is about: its index and field, code unchanged."""
    try:
        yield
    except ChorusError as exc:
        exc.details = {
            "index": index,
            "field": exc.details.get("field") or _FIELD_OF.get(exc.code, ""),
            **exc.details,
        }
        exc.message = f"Item {index}: {exc.message}"
        raise


def batch_create(
    *,
    tenant: Tenant,
    api_key: ApiKey | None,
    items: list[ItemSpec],
    priority: str = "low",
    idempotency_key: str = "",
) -> Batch:
    """Admit every item or none: the whole batch is checked first, then its jobs
    are created and charged in one transaction, so an item refused there (the
    month's characters ran out meanwhile) refuses the batch, with nothing kept.

    With an `idempotency_key`, the same key and batch within 24 hours give the
    same batch, admitted and charged once (a client retrying after a timeout);
    the same key with another batch is refused (409). A refused batch keeps no
    key: its retry is a new attempt."""
    fingerprint = batch_fingerprint(priority=priority, items=items) if idempotency_key else ""
    for _ in range(2):
        if idempotency_key:
            earlier = _batch_for_key(tenant=tenant, key=idempotency_key, fingerprint=fingerprint)
            if earlier is not None:
                return earlier
        try:
            return _batch_admit(
                tenant=tenant,
                api_key=api_key,
                items=items,
                priority=priority,
                idempotency_key=idempotency_key,
                fingerprint=fingerprint,
            )
        except _KeyTaken:
            # A parallel request with this key committed first: the second pass
            # finds its batch (or refuses a different one).
            continue
    raise AssertionError("unreachable: an idempotency key taken twice")


def _batch_admit(
    *,
    tenant: Tenant,
    api_key: ApiKey | None,
    items: list[ItemSpec],
    priority: str,
    idempotency_key: str,
    fingerprint: str,
) -> Batch:
    _check(tenant=tenant, items=items, priority=priority)
    copied: dict[int, CopiedResult] = {}  # objects result reuse made; gone again if refused
    try:
        # Earlier results are looked for and copied first: a copy is network I/O,
        # and the transaction below holds the tenant's lock from the first item on.
        for index, item in enumerate(items):
            with item_errors(index):
                result = job_copy_earlier_result(tenant=tenant, speech=item.speech)
            if result is not None:
                copied[index] = result
        # The other items' rows are built now too: the transaction only sends them.
        prepared = batch_items_prepare(
            tenant=tenant,
            api_key=api_key,
            items=[(index, item) for index, item in enumerate(items) if index not in copied],
            priority=priority,
        )
        with transaction.atomic():
            try:
                # First, in a savepoint: a parallel request holding this key makes
                # this wait for its commit, and then refuse before any item.
                with transaction.atomic():
                    batch = Batch.objects.create(
                        tenant=tenant,
                        api_key=api_key,
                        priority=priority,
                        item_count=len(items),
                        characters=sum(len(item.speech.text) for item in items),
                        idempotency_key=idempotency_key,
                        request_fingerprint=fingerprint,
                    )
            except IntegrityError:
                raise _KeyTaken() from None
            # Items to run: checked, charged and written together (`batches.admission`).
            batch_items_admit(tenant=tenant, batch=batch, prepared=prepared, priority=priority)
            # Items answered by an earlier result: succeeded jobs, one by one.
            for index, result in copied.items():
                item = items[index]
                with item_errors(index):
                    job = job_create(
                        tenant=tenant,
                        api_key=api_key,
                        speech=item.speech,
                        priority=priority,
                        in_batch=True,
                        copied=result,
                    )
                BatchItem.objects.create(
                    batch=batch,
                    index=index,
                    custom_id=item.custom_id,
                    metadata=item.metadata,
                    job=job,
                )
            # Every item may have been answered by reuse already.
            transaction.on_commit(lambda: batch_settle(batch_id=batch.pk))
    except BaseException:
        for result in copied.values():
            get_storage().delete(bucket=tenant.bucket, key=result.output_key)
        raise
    return batch


class _KeyTaken(Exception):
    pass


def _batch_for_key(*, tenant: Tenant, key: str, fingerprint: str) -> Batch | None:
    """The batch an earlier request with this key made, if it was the same batch."""
    earlier = Batch.objects.filter(tenant=tenant, idempotency_key=key).first()
    if earlier is None:
        return None
    if earlier.created_at < timezone.now() - IDEMPOTENCY_TTL:
        # Forgotten after 24 hours, as a job's key is: the key is free again.
        Batch.objects.filter(pk=earlier.pk).update(idempotency_key="")
        return None
    if earlier.request_fingerprint != fingerprint:
        raise IdempotencyKeyReused(
            "This Idempotency-Key was used with a different batch. Use a new key.",
            details={"idempotency_key": key, "batch_id": str(earlier.pk)},
        )
    return earlier


def _check(*, tenant: Tenant, items: list[ItemSpec], priority: str) -> None:
    """Everything that can be checked before anything is written."""
    limits = tenant_limits(tenant)
    batch_limits = tenant_batch_limits(tenant)
    if len(items) > batch_limits.max_items:
        raise BatchTooLarge(
            f"The batch has {len(items)} items; your plan takes {batch_limits.max_items} "
            "in one batch. Split it.",
            details={"limit": batch_limits.max_items, "value": len(items), "field": "items"},
        )
    characters = sum(len(item.speech.text) for item in items)
    if characters > batch_limits.max_characters:
        raise BatchTooLarge(
            f"The batch's texts are {characters} characters in all; your plan takes "
            f"{batch_limits.max_characters} in one batch. Split it.",
            details={"limit": batch_limits.max_characters, "value": characters, "field": "items"},
        )
    limits_check_priority(limits=limits, priority=priority)
    voice_ids = {item.speech.voice_id for item in items if item.speech.voice_id is not None}
    known: dict[uuid.UUID | None, Voice] = {
        voice.pk: voice for voice in Voice.objects.filter(tenant=tenant, pk__in=voice_ids)
    }
    for index, item in enumerate(items):
        speech = item.speech
        with item_errors(index):
            limits_check_text(limits=limits, text=speech.text)
            _check_output(speech)
            if speech.voice_id is not None and speech.voice_id not in known:
                raise NotFound("No voice with this id.", details={"voice_id": str(speech.voice_id)})
            job_check_for_engine(
                text=speech.text, voice=known.get(speech.voice_id), instruction=speech.instruction
            )
    period = usage_period_current(tenant=tenant)
    left = limits.monthly_characters - period.characters_used - period.characters_reserved
    if characters > left:
        raise QuotaExceeded(
            f"The batch needs {characters} characters but only {max(0, left)} are left this "
            "month; nothing was submitted.",
            details={
                "limit": limits.monthly_characters,
                "used": period.characters_used,
                "reserved": period.characters_reserved,
                "requested": characters,
                "resets_at": period.ends_at.isoformat(),
            },
        )


def _check_output(speech: SpeechRequest) -> None:
    try:
        check_output(speech.format, speech.sample_rate)
    except UnsupportedOutput as exc:
        known = speech.format in OUTPUT_FORMATS
        exc.details = {"field": "sample_rate" if known else "format", **exc.details}
        raise


def batch_settle(*, batch_id: uuid.UUID) -> bool:
    """End a running batch whose items have all ended. Exactly once, however
    many items finish at once: the conditional UPDATE lets one caller through."""
    items = Job.objects.filter(batch_item__batch_id=batch_id)
    if items.filter(status__in=IN_FLIGHT).exists():
        return False
    failed = items.exclude(status=JobStatus.SUCCEEDED).exists()
    status = BatchStatus.COMPLETED_WITH_FAILURES if failed else BatchStatus.COMPLETED
    with transaction.atomic():
        ended = Batch.objects.filter(pk=batch_id, status=BatchStatus.RUNNING).update(
            status=status, finished_at=timezone.now()
        )
        if ended:
            transaction.on_commit(lambda: batch_ended(batch_id=batch_id))
    return bool(ended)
