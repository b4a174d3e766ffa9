"""How far a long-form job has come: segments done, audio so far, an estimate."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Min, Q, Sum
from django.utils import timezone

from synthesis.models import Job, JobStatus


@dataclass(frozen=True)
class Progress:
    segments_done: int
    segments_total: int
    audio_seconds: float
    estimated_finish_at: datetime | None


def longform_progress(*, job: Job) -> Progress | None:
    """None for an ordinary job. One aggregate over the job's segments."""
    if not job.is_longform:
        return None
    total = job.segments_total or 0
    row = Job.objects.filter(parent_id=job.pk).aggregate(
        done=Count("id", filter=Q(status=JobStatus.SUCCEEDED)),
        seconds=Sum("duration_s", filter=Q(status=JobStatus.SUCCEEDED)),
        first_start=Min("started_at"),
    )
    done = int(row["done"] or 0)
    estimate = None
    if job.status == JobStatus.RUNNING and done and row["first_start"] is not None:
        # The pace so far (segments run in parallel on however many workers are
        # free), carried over the segments left; the join adds little.
        now = timezone.now()
        per_segment = (now - row["first_start"]) / done
        estimate = now + per_segment * (total - done)
    elif job.status == JobStatus.SUCCEEDED:
        done = total
    return Progress(
        segments_done=done,
        segments_total=total,
        audio_seconds=round(float(row["seconds"] or 0.0), 3)
        if job.status != JobStatus.SUCCEEDED
        else float(job.duration_s or 0.0),
        estimated_finish_at=estimate,
    )
