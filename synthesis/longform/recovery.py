"""Repairs for long-form jobs whose next step was lost: the sweeper's pass.

A long-form job moves on through two messages to the `light` queue: the split
(sent after the submit commits) and the join (sent when the last segment
succeeds). Either can be lost: the process dies between its commit and its
send, or the broker loses its data. Both tasks are idempotent, so a job still
waiting for one after `STALE` gets it again.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, F, Max, Q
from django.utils import timezone

from synthesis.longform.lifecycle import longform_send_join
from synthesis.longform.submit import segment_chars, send_split
from synthesis.models import Job, JobStatus

# The split and the join take a second or two; a job waiting far longer lost its message.
STALE = timedelta(seconds=60)
BATCH = 100


def longform_repair(*, now: datetime | None = None) -> int:
    """Send the split or join again where it is overdue; returns how many."""
    cutoff = (now or timezone.now()) - STALE
    sent = 0
    running = Job.objects.filter(status=JobStatus.RUNNING, segments_total__isnull=False)
    unsplit = running.filter(segments_total=0, created_at__lt=cutoff).order_by("created_at")
    for parent_id in unsplit.values_list("pk", flat=True)[:BATCH]:
        first = Job.objects.filter(parent_id=parent_id, segment_index=0).first()
        if first is not None:
            send_split(
                parent_id=parent_id,
                after=first.characters,
                max_chars=segment_chars(settings.ENGINE),
            )
            sent += 1
    unjoined = (
        running.filter(segments_total__gt=0)
        .annotate(
            done=Count("segments", filter=Q(segments__status=JobStatus.SUCCEEDED)),
            last=Max("segments__finished_at"),
        )
        .filter(done=F("segments_total"), last__lt=cutoff)
        .order_by("created_at")
    )
    for parent_id in unjoined.values_list("pk", flat=True)[:BATCH]:
        longform_send_join(parent_id=parent_id)
        sent += 1
    return sent
