"""The batches' part of the sweeper's pass: end batches whose last item's
settlement was lost, finish cancels whose light task was lost, build archives
whose task was lost, expire old archives.

Every path that ends an item settles its batch after commit; a process that died
in between leaves the batch `running` with every item ended. The archive task
can be lost the same way (a broker restart), and so can the end of a cancelled
batch (`batches.cancelling`): a batch left `cancelling`, or `cancelled` with an
item still in flight, is finished here. All are found here, a bounded few per
pass."""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from batches.cancelling import batch_cancel_finish
from batches.models import ArchiveStatus, Batch, BatchItem, BatchStatus
from batches.services import batch_settle
from quotas.counters import storage_add
from quotas.plans import tenants_by_retention
from synthesis.models import IN_FLIGHT
from synthesis.storage_runtime import get_storage

log = logging.getLogger(__name__)

SWEEP_BATCH = 100
# Cancelled batches finished per pass, and chunks of items each (`batches.cancelling`):
# a pass stays within seconds; what is left, the next pass goes on with.
SWEEP_CANCELS = 10
CANCEL_CHUNKS_PER_PASS = 4
# An archive task not started this long after its batch ended is taken as lost.
ARCHIVE_GRACE = timedelta(minutes=5)


def batches_sweep() -> dict[str, int]:
    return {
        "settled": _settle_lost(),
        "cancels_finished": _finish_cancels(),
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


def _finish_cancels() -> int:
    """Batches whose cancel's end was lost, and cancelled ones with an item in
    flight (admitted or put back in line after the cancel, or left by a cancel
    that stopped part-way): their items cancelled and refunded, the batch ended."""
    cancelling = Batch.objects.filter(status=BatchStatus.CANCELLING).order_by("created_at")
    # Found from the items in flight (a bounded set), not from every cancelled batch.
    leftover = (
        BatchItem.objects.filter(
            batch__status=BatchStatus.CANCELLED, job__in_batch=True, job__status__in=IN_FLIGHT
        )
        .order_by()
        .values_list("batch_id", flat=True)
        .distinct()
    )
    due = [*cancelling.values_list("pk", flat=True)[:SWEEP_CANCELS], *leftover[:SWEEP_CANCELS]]
    for batch_id in due:
        batch_cancel_finish(batch_id=batch_id, max_chunks=CANCEL_CHUNKS_PER_PASS)
    return len(due)


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
    """An archive goes when its audio would, after the plan's retention: marked
    expired and its bytes freed in one transaction, deleted once that committed.
    Found one retention at a time, so archives kept longer (another plan) never
    hold back those that are due."""
    now = timezone.now()
    room = SWEEP_BATCH
    expired: list[tuple[str, str]] = []
    for days, tenant_ids in tenants_by_retention().items():
        if room <= 0:
            break
        due = Batch.objects.filter(
            archive_status=ArchiveStatus.READY,
            tenant_id__in=tenant_ids,
            finished_at__lt=now - timedelta(days=days),
        ).order_by("finished_at")
        with transaction.atomic():
            # Rows another sweeper holds are its to expire; only the batch rows
            # are locked (the join reads the tenant's bucket, and a submit locks
            # the tenant's row).
            rows = list(
                due.select_for_update(skip_locked=True, no_key=True, of=("self",)).values_list(
                    "pk", "tenant_id", "tenant__bucket", "archive_key", "archive_bytes"
                )[:room]
            )
            if not rows:
                continue
            # Marked first: no link is handed out for an object about to vanish.
            Batch.objects.filter(pk__in=[pk for pk, *_ in rows]).update(
                archive_status=ArchiveStatus.EXPIRED
            )
            freed: dict[int, int] = defaultdict(int)
            for _, tenant_id, _, _, size in rows:
                freed[tenant_id] += size or 0
            for tenant_id, size in freed.items():
                storage_add(tenant_id=tenant_id, delta=-size)
        expired += [(bucket, key) for _, _, bucket, key, _ in rows]
        room -= len(rows)
    storage = get_storage()
    for bucket, key in expired:
        try:
            storage.delete(bucket=bucket, key=key)
        except Exception:  # marked expired; the object is left over, not linked
            log.exception("could not delete the archive %s/%s", bucket, key)
    return len(expired)
