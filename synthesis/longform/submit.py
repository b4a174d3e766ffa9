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

import uuid
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import transaction

from chorus.errors import ChorusError
from quotas.limits import limits_check_text
from quotas.plans import Limits
from synthesis.longform.split import Segment, detect_language, split_text
from synthesis.models import Job, JobStatus
from synthesis.services.dispatch import FIRST_EPOCH, job_publish_created
from tenants.models import Tenant


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


def longform_plan(*, limits: Limits, text: str, language: str) -> list[Segment] | None:
    """The segments of a text too long for one job, or None for an ordinary job.
    Refuses a text over the plan's long-form limit (413), or over its one-job
    limit when the plan has no long-form (422 `text_too_long`)."""
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
    # Segment 0 is the first sentence alone: a stream's first audio then waits
    # for one sentence, as with a short text.
    return split_text(
        text, language=language, max_chars=segment_chars(settings.ENGINE), first_max_chars=0
    )


def longform_language(text: str, language: str) -> str:
    return language or detect_language(text)


def segment_id(parent_id: uuid.UUID, index: int) -> uuid.UUID:
    """Deterministic and ascending with the index: pending segments are released
    by (created_at, id), and a bulk insert can give several the same instant."""
    return uuid.UUID(int=(parent_id.int & ~0xFFFFFFFF) | index)


def longform_create(
    *,
    tenant: Tenant,
    segments: list[Segment],
    fields: dict[str, Any],
    broker_slots: int,
    on_publish_failed: Callable[[Job], None],
) -> Job:
    """Insert the parent and its segments; call inside the submit's transaction,
    under the tenant's lock. `broker_slots`: how many segments may go to the
    broker now (the tenant's free slots for this priority)."""
    assert transaction.get_connection().in_atomic_block
    parent = Job.objects.create(
        tenant=tenant,
        status=JobStatus.RUNNING,
        segments_total=len(segments),
        **fields,
    )
    children = [
        Job(
            id=segment_id(parent.id, segment.index),
            tenant=tenant,
            parent=parent,
            segment_index=segment.index,
            status=JobStatus.QUEUED if segment.index < broker_slots else JobStatus.PENDING,
            epoch=FIRST_EPOCH if segment.index < broker_slots else 0,
            **{
                **fields,
                "text": segment.text,
                "characters": segment.characters,
                # Joined later into the format asked for: raw samples meanwhile.
                "format": "pcm",
                "requested_sample_rate": None,
            },
        )
        for segment in segments
    ]
    Job.objects.bulk_create(children)
    queued = [child for child in children if child.status == JobStatus.QUEUED]

    def publish() -> None:
        for child in queued:  # in order: segment 0 reaches a worker first
            if not job_publish_created(job=child):
                on_publish_failed(parent)
                return

    transaction.on_commit(publish)
    return parent
