"""The batches' part of the sweeper's pass: end batches whose last item's
settlement was lost, build archives whose task was lost, expire old archives.

Every path that ends an item settles its batch after commit; a process that died
in between leaves the batch `running` with every item ended. The archive task
can be lost the same way (a broker restart). Both are found here, a bounded few
per pass."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from batches.models import ArchiveStatus, Batch, BatchItem, BatchStatus
from batches.services import batch_settle
from quotas.plans import tenant_limits
from synthesis.models import IN_FLIGHT
from synthesis.storage_runtime import get_storage

log = logging.getLogger(__name__)

SWEEP_BATCH = 100
# An archive task not started this long after its batch ended is taken as lost.
ARCHIVE_GRACE = timedelta(minutes=5)


def batches_sweep() -> dict[str, int]:
    return {
        "settled": _settle_lost(),
        "archives_requeued": _requeue_lost_archives(),
        "archives_expired": _expire_archives(),
    }


def _settle_lost() -> int:
    unfinished = BatchItem.objects.filter(batch=OuterRef("pk"), job__status__in=IN_FLIGHT)
    stale = (
        Batch.objects.filter(status=BatchStatus.RUNNING)
        .filter(~Exists(unfinished))
        .order_by("created_at")
        .values_list("pk", flat=True)[:SWEEP_BATCH]
    )
    return sum(batch_settle(batch_id=batch_id) for batch_id in stale)


def _requeue_lost_archives() -> int:
    from batches.tasks import build_archive_task

    now = timezone.now()
    building_for = timedelta(seconds=settings.TASK_TIME_LIMIT_S) + ARCHIVE_GRACE
    lost = (
        Batch.objects.exclude(status=BatchStatus.RUNNING)
        .filter(
            Q(archive_status=ArchiveStatus.WAITING, finished_at__lt=now - ARCHIVE_GRACE)
            | Q(archive_status=ArchiveStatus.BUILDING, finished_at__lt=now - building_for)
        )
        .order_by("finished_at")
        .values_list("pk", flat=True)[:SWEEP_BATCH]
    )
    requeued = 0
    for batch_id in lost:
        try:
            build_archive_task.apply_async(args=(str(batch_id),))
            requeued += 1
        except Exception:
            log.exception("could not enqueue the archive of batch %s", batch_id)
    return requeued


def _expire_archives() -> int:
    """An archive goes when its audio would: after the plan's retention."""
    now = timezone.now()
    expired = 0
    ready = Batch.objects.filter(archive_status=ArchiveStatus.READY).select_related("tenant__plan")
    for batch in ready.order_by("finished_at")[:SWEEP_BATCH]:
        days = tenant_limits(batch.tenant).output_retention_days
        if batch.finished_at is None or batch.finished_at > now - timedelta(days=days):
            continue
        # Marked first: no link is handed out for an object about to vanish.
        if Batch.objects.filter(pk=batch.pk, archive_status=ArchiveStatus.READY).update(
            archive_status=ArchiveStatus.EXPIRED
        ):
            try:
                get_storage().delete(bucket=batch.tenant.bucket, key=batch.archive_key)
            except Exception:
                log.exception("could not delete the archive of batch %s", batch.pk)
            expired += 1
    return expired
