"""Admitting a long-form job (web tier): split the text, then create the parent
and its segments in the submit's transaction (`synthesis.services.jobs`).

The parent is never sent to a worker: it is `running` from the start (no
worker, no `started_at`, so recovery and the stuck-job rescue never pick it
up) until its segments are joined (`synthesis.longform.join`) or it fails or is
cancelled. Segments are admitted like any job of the tenant: as many as its
free broker slots go out at once, segment 0 first; the rest wait as `pending`
and are released in order as workers claim them.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction

from chorus.errors import ChorusError
from quotas.limits import limits_check_text
from quotas.plans import Limits
from synthesis.job_lifecycle import Event, created_status
from synthesis.longform.lifecycle import longform_check_complete
from synthesis.longform.split import Segment, detect_language, first_segment, split_text
from synthesis.models import Job, JobStatus
from synthesis.publishers import send_longform_split
from synthesis.services.dispatch import (
    admission_slots,
    created_dispatch_fields,
    job_publish_created,
    tenant_line,
)
from synthesis.speech_request import SpeechRequest
from tenants.locks import tenant_lock
from tenants.models import Tenant

log = logging.getLogger(__name__)


class LongformTextTooLong(ChorusError):
    status = 413
    code = "longform_text_too_long"


# Characters per segment, per engine: short enough for one engine call (CosyVoice2
# merges sentences up to ~80 tokens itself; espeak has no limit but one long
# call holds a worker), long enough that each call's fixed cost stays small.
SEGMENT_CHARS = {"cosyvoice2": 200, "espeak": 400, "synthetic": 250}
DEFAULT_SEGMENT_CHARS = 250


def segment_chars(engine: str) -> int:
    return SEGMENT_CHARS.get(engine, DEFAULT_SEGMENT_CHARS)


@dataclass(frozen=True)
class LongformPlan:
    first: Segment  # segment 0: sent to a worker before the rest is split
    language: str
    max_chars: int


def longform_plan(*, limits: Limits, text: str, language: str) -> LongformPlan | None:
    """How a text too long for one job starts as a long-form job, or None for an
    ordinary job. Refuses a text over the plan's long-form limit (413), or over its
    one-job limit when the plan has no long-form (422 `text_too_long`)."""
    if len(text) <= limits.max_text_chars:
        return None
    if limits.max_longform_chars <= limits.max_text_chars:
        limits_check_text(limits=limits, text=text)
    if len(text) > limits.max_longform_chars:
        raise LongformTextTooLong(
            f"The text is {len(text)} characters long; your plan allows "
            f"{limits.max_longform_chars} in one long-form job. Split it into several jobs.",
            details={"limit": limits.max_longform_chars, "value": len(text)},
        )
    language = language or detect_language(text)
    max_chars = segment_chars(settings.ENGINE)
    # Segment 0 is the first sentence alone, found from the text's start: a
    # stream's first audio then waits for one sentence, as with a short text,
    # and not for the whole text to be split (0.2 s for 50,000 characters).
    first = first_segment(text, language=language, max_chars=max_chars)
    return LongformPlan(first=first, language=language, max_chars=max_chars)


def segment_id(parent_id: uuid.UUID, index: int) -> uuid.UUID:
    """Deterministic and ascending with the index: pending segments are released
    by (created_at, id), and a bulk insert can give several the same instant; a
    redelivered split finds the rows it made."""
    return uuid.UUID(int=(parent_id.int & ~0xFFFFFFFF) | index)


def longform_create(
    *,
    tenant: Tenant,
    plan: LongformPlan,
    fields: dict[str, Any],
    broker_slots: int,
    on_publish_failed: Callable[[Job], None],
) -> Job:
    """Insert the parent and segment 0; call inside the submit's transaction,
    under the tenant's lock. After commit, segment 0 goes to the broker and the
    rest of the text to a `light` worker to be split (`longform_split_rest`).
    `segments_total` is 0 until then."""
    assert transaction.get_connection().in_atomic_block
    parent = Job.objects.create(
        tenant=tenant,
        status=created_status(Event.LONGFORM_ADMITTED),
        segments_total=0,
        **{**fields, "language": plan.language},
    )
    first = _segment_rows(parent, [plan.first], fields=fields, broker_slots=broker_slots)[0]

    def publish() -> None:
        if first.status == JobStatus.QUEUED and not job_publish_created(job=first):
            on_publish_failed(parent)
            return
        try:
            send_split(parent_id=parent.pk, after=plan.first.end, max_chars=plan.max_chars)
        except Exception:
            log.exception("could not send the split of job %s", parent.pk)
            on_publish_failed(parent)

    transaction.on_commit(publish)
    return parent


def send_split(*, parent_id: uuid.UUID, after: int, max_chars: int) -> None:
    send_longform_split(str(parent_id), after, max_chars)


def longform_split_rest(*, parent_id: uuid.UUID | str, after: int, max_chars: int) -> int:
    """Split the text after segment 0 and admit those segments (a `light` task);
    returns how many. Safe to repeat: a parent already split, or ended, is left."""
    parent = Job.objects.filter(pk=parent_id).first()
    if parent is None or parent.status != JobStatus.RUNNING or parent.segments_total:
        return 0
    rest = split_text(
        parent.text, language=parent.language, max_chars=max_chars, start=after, first_index=1
    )
    with transaction.atomic():
        tenant_lock(parent.tenant_id)  # admission's lock order: tenant, then its rows
        locked = Job.objects.select_for_update(no_key=True).filter(
            pk=parent.pk, status=JobStatus.RUNNING, segments_total=0
        )
        if not locked.exists():
            return 0
        fields = segment_fields(parent)
        slots = admission_slots(
            line=tenant_line(tenant_id=parent.tenant_id, priority=parent.priority)
        )
        rows = _segment_rows(parent, rest, fields=fields, broker_slots=slots)
        Job.objects.filter(pk=parent.pk).update(segments_total=1 + len(rest))
        queued = [row for row in rows if row.status == JobStatus.QUEUED]
        transaction.on_commit(lambda: [job_publish_created(job=row) for row in queued] and None)
        # Segment 0 may be done already (or be the only one).
        transaction.on_commit(lambda: longform_check_complete(parent_id=parent.pk))
    return len(rest)


def segment_fields(parent: Job) -> dict[str, Any]:
    """What a segment copies from its parent: its request (`_segment_rows` sets
    the segment's own text and raw format), who asked and in which queue."""
    return {
        **SpeechRequest.of_job(parent).job_fields(),
        "voice_id": parent.voice_id,
        "voice_name": parent.voice_name,
        "api_key_id": parent.api_key_id,
        "priority": parent.priority,
    }


def _segment_rows(
    parent: Job, segments: list[Segment], *, fields: dict[str, Any], broker_slots: int
) -> list[Job]:
    """Insert segment rows: the first `broker_slots` of them `queued` (published
    by the caller after commit), the rest `pending` (released in order)."""
    rows = []
    for position, segment in enumerate(segments):
        queued = position < broker_slots
        rows.append(
            Job(
                **{
                    **fields,
                    "text": segment.text,
                    "characters": segment.characters,
                    # Joined later into the format asked for: raw samples meanwhile.
                    "format": "pcm",
                    "requested_sample_rate": None,
                    # Never offered for reuse: its audio is deleted once joined.
                    "reuse_key": "",
                },
                id=segment_id(parent.id, segment.index),
                tenant_id=parent.tenant_id,
                parent=parent,
                segment_index=segment.index,
                **created_dispatch_fields(queued=queued),
            )
        )
    Job.objects.bulk_create(rows)
    return rows
