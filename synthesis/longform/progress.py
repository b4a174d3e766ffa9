"""How far a long-form job has come: segments done, audio so far, an estimate,
and the timings its parent row does not hold (it is never claimed, so has no
`started_at`: `synthesis.longform.submit`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Min, Q, Sum
from django.utils import timezone

from synthesis.models import Job, JobStatus


@dataclass(frozen=True)
class Segments:
    """What a long-form job's segments say about it, read in one aggregate."""

    done: int = 0
    seconds: float = 0.0
    started_at: datetime | None = None  # when the first segment started
    first_audio_at: datetime | None = None  # segment 0's first audio


@dataclass(frozen=True)
class Progress:
    segments_done: int
    segments_total: int
    audio_seconds: float
    estimated_finish_at: datetime | None


def longform_segments(*, jobs: Iterable[Job]) -> dict[uuid.UUID, Segments]:
    """The long-form jobs among `jobs`, each with its segments' tally: one
    grouped query for a whole page (none when the page holds no long text)."""
    ids = [job.pk for job in jobs if job.is_longform]
    if not ids:
        return {}
    rows = (
        Job.objects.filter(parent_id__in=ids)
        .order_by()
        .values("parent_id")
        .annotate(
            done=Count("id", filter=Q(status=JobStatus.SUCCEEDED)),
            seconds=Sum("duration_s", filter=Q(status=JobStatus.SUCCEEDED)),
            started_at=Min("started_at"),
            first_audio_at=Min("first_audio_at", filter=Q(segment_index=0)),
        )
    )
    found = {
        row["parent_id"]: Segments(
            done=int(row["done"] or 0),
            seconds=float(row["seconds"] or 0.0),
            started_at=row["started_at"],
            first_audio_at=row["first_audio_at"],
        )
        for row in rows
    }
    return {pk: found.get(pk, Segments()) for pk in ids}


def longform_progress(*, job: Job, segments: Segments) -> Progress:
    total = job.segments_total or 0
    done = segments.done
    estimate = None
    if job.status == JobStatus.RUNNING and done and segments.started_at is not None:
        # The pace so far (segments run in parallel on however many workers are
        # free), carried over the segments left; the join adds little.
        now = timezone.now()
        per_segment = (now - segments.started_at) / done
        estimate = now + per_segment * (total - done)
    elif job.status == JobStatus.SUCCEEDED:
        done = total
    return Progress(
        segments_done=done,
        segments_total=total,
        audio_seconds=round(segments.seconds, 3)
        if job.status != JobStatus.SUCCEEDED
        else float(job.duration_s or 0.0),
        estimated_finish_at=estimate,
    )
