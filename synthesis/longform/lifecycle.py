"""A long-form job's state as its segments finish (worker side) or as it is
cancelled (web side).

- A segment succeeds: once every segment has, the join task goes to the `light`
  queue (CPU workers). Several segments may finish together: the parent's row
  lock serializes their checks, and the join itself is idempotent.
- A segment fails for good (after the ordinary retries: storage backoff, up to
  3 attempts when its worker dies): the whole job fails, its other segments are
  cancelled and the whole reservation is refunded (no file was delivered).
- Cancel: segments not yet started are cancelled at once; running ones stop at
  their next chunk. The characters of segments that had started are charged,
  the rest (those of unstarted segments) refunded. Once every segment has
  succeeded the cancel comes too late: the whole text is made and charged, so
  the join goes on and delivers the file (`longform_cancel` says no).
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from quotas.services import quota_commit_part, quota_refund
from synthesis.job_events import job_finished
from synthesis.job_lifecycle import Event, job_transition, jobs_transition
from synthesis.models import IN_FLIGHT, WAITING, Job, JobStatus
from synthesis.publishers import send_longform_join
from synthesis.storage_runtime import get_storage
from synthesis.streaming import stream_announce_end

log = logging.getLogger(__name__)

JOIN_QUEUE = "light"


def longform_segment_succeeded(*, segment: Job) -> bool:
    """Record a segment's success on its parent; True when it was the last one
    and the join was sent."""
    assert segment.parent_id is not None
    if segment.segment_index == 0:
        first = Job.objects.values_list("first_audio_at", flat=True).get(pk=segment.pk)
        Job.objects.filter(pk=segment.parent_id, first_audio_at__isnull=True).update(
            first_audio_at=first
        )
    return longform_check_complete(parent_id=segment.parent_id)


def longform_check_complete(*, parent_id: uuid.UUID | str) -> bool:
    """Send the join once every segment succeeded. The parent's row lock
    serializes segments finishing together; a join sent twice is harmless."""
    with transaction.atomic():
        parent = (
            Job.objects.select_for_update(no_key=True)
            .filter(pk=parent_id, status=JobStatus.RUNNING)
            .first()
        )
        if parent is None or not parent.segments_total:  # ended, or not split yet
            return False
        done = Job.objects.filter(parent_id=parent.pk, status=JobStatus.SUCCEEDED).count()
        if done < parent.segments_total:
            return False
        transaction.on_commit(lambda: longform_send_join(parent_id=parent.pk))
    return True


def longform_send_join(*, parent_id: uuid.UUID | str) -> None:
    send_longform_join(str(parent_id))


def longform_segment_failed(*, segment_id: uuid.UUID | str, code: str, message: str) -> None:
    parent_id = Job.objects.filter(pk=segment_id).values_list("parent_id", flat=True).first()
    if parent_id is not None:
        longform_fail(parent_id=parent_id, code=code, message=message)


def longform_fail(*, parent_id: uuid.UUID | str, code: str, message: str) -> bool:
    """Fail the whole job and refund it all; its other segments stop."""
    with transaction.atomic():
        failed = job_transition(
            event=Event.LONGFORM_FAILED,
            job_id=parent_id,
            error_code=code,
            error_message=f"A segment of this long text failed: {message}",
            finished_at=timezone.now(),
        )
        if failed:
            _stop_segments(parent_id=parent_id, statuses=IN_FLIGHT)
            quota_refund(job_id=parent_id)
    if failed:
        parent = Job.objects.get(pk=parent_id)
        job_finished(job=parent, status=JobStatus.FAILED, code=code)
        _after_end(parent)
    return bool(failed)


class _AllSegmentsDone(Exception):
    """Raised inside the cancel's transaction to undo it: nothing was left to stop."""


def longform_cancel(*, parent: Job) -> bool:
    """Cancel a long-form job; True if this call did. Charges the characters of
    the segments that had started and refunds the rest. False when the job has
    ended, or when every segment has succeeded: then the join delivers the file
    (sent by the last segment, or again by the sweeper) and the job is charged
    as any finished one; cancelling it would charge the whole text for nothing."""
    try:
        with transaction.atomic():
            cancelled = job_transition(
                event=Event.LONGFORM_CANCELLED,
                job_id=parent.pk,
                error_code="cancelled",
                finished_at=timezone.now(),
            )
            if not cancelled:
                return False
            # Waiting segments first: a claim racing this UPDATE either wins (the
            # segment started and counts as such) or finds the segment cancelled.
            _stop_segments(parent_id=parent.pk, statuses=WAITING)
            started = (
                Job.objects.filter(parent_id=parent.pk)
                .exclude(status=JobStatus.CANCELLED)
                .aggregate(n=Sum("characters"))["n"]
                or 0
            )
            _stop_segments(parent_id=parent.pk, statuses=(JobStatus.RUNNING,))
            # Counted after the stops: a segment that was finishing as they ran is
            # either stopped by them or seen here as succeeded. The parent's row
            # lock, held since the UPDATE above, keeps the last segment's look
            # (`longform_check_complete`) waiting until this commits or undoes.
            if _all_succeeded(parent_id=parent.pk):
                raise _AllSegmentsDone()
            refunded = parent.characters - started
            Job.objects.filter(pk=parent.pk).update(
                error_message=f"The job was cancelled at your request: {started} characters "
                f"of segments that had started were charged, {refunded} refunded."
            )
            if started:
                quota_commit_part(job_id=parent.pk, characters=started)
            else:
                quota_refund(job_id=parent.pk)
    except _AllSegmentsDone:
        return False
    parent.refresh_from_db()
    job_finished(job=parent, status=JobStatus.CANCELLED, code="cancelled")
    _after_end(parent)
    return True


def _all_succeeded(*, parent_id: Any) -> bool:
    total = Job.objects.filter(pk=parent_id).values_list("segments_total", flat=True).get()
    if not total:  # not split yet: segments are still to come
        return False
    return Job.objects.filter(parent_id=parent_id, status=JobStatus.SUCCEEDED).count() == total


def _stop_segments(*, parent_id: Any, statuses: tuple[str, ...]) -> int:
    # A running segment's worker sees its row no longer `running` at its next
    # chunk and stops (`synthesis.services.execution._owned`).
    return jobs_transition(
        event=Event.CANCELLED,
        jobs=Job.objects.filter(parent_id=parent_id),
        statuses=statuses,
        error_code="cancelled",
        error_message="Its long-form job ended.",
        finished_at=timezone.now(),
    )


def _after_end(parent: Job) -> None:
    """What follows a failed or cancelled long-form job, outside its transaction:
    live streams of unfinished segments end, stored segment audio goes."""
    segments = list(Job.objects.filter(parent_id=parent.pk).order_by("segment_index"))
    if parent.stream:
        stream_announce_end(job_id=parent.pk, code=parent.error_code, message=parent.error_message)
        for segment in segments:
            if segment.status == JobStatus.CANCELLED:
                stream_announce_end(
                    job_id=segment.pk, code=parent.error_code, message=parent.error_message
                )
    longform_delete_segment_audio(parent=parent, segments=segments)


def longform_delete_segment_audio(*, parent: Job, segments: list[Job]) -> None:
    """Segment audio is internal: once the job ended (joined, failed, cancelled)
    it is marked deleted and removed from the bucket."""
    stored = [s for s in segments if s.output_key and s.output_deleted_at is None]
    if not stored:
        return
    Job.objects.filter(pk__in=[s.pk for s in stored]).update(output_deleted_at=timezone.now())
    storage = get_storage()
    for segment in stored:
        try:
            storage.delete(bucket=parent.tenant.bucket, key=segment.output_key)
        except Exception:  # marked deleted; the object is left over, never linked
            log.exception("could not delete segment audio %s", segment.output_key)
