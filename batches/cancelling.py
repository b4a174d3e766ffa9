"""Cancelling a batch: set-based in the request, ended in the background.

The request marks the batch `cancelling` and, in the same transaction, cancels
every unfinished item (pending, queued and running alike) and refunds them: one
UPDATE of the items and one INSERT of their refunds into the ledger, whatever
the batch's size (`quotas.refunds`), so it answers in milliseconds and holds no
request thread. A running item's worker sees its row no longer `running` at its
next chunk and stops, as with a single job's cancel; a queued item's message is
skipped by the claim. A light worker then ends the batch (`cancelled`, the
`batch_completed` signal, the archive: `batch_cancel_finish`); the sweeper does
it for a batch whose task was lost, so a cancel is never left half done.

No item of a cancelled batch starts: besides the items' own status, the claim
refuses an item whose batch is `cancelling` or `cancelled`
(`CLAIM_GUARD_SQL`), which covers an item admitted or put back in line after
the cancel (a chunked admission, a redelivery), until the next pass cancels it.
"""

from __future__ import annotations

import logging
import uuid

from django.db import connection, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from batches.ending import batch_ended
from batches.errors import BatchNotCancellable
from batches.models import Batch, BatchItem, BatchStatus
from chorus import metrics
from quotas.refunds import quota_refund_cancelled
from synthesis.models import IN_FLIGHT, Job, JobStatus
from synthesis.services.dispatch import admission_refill
from tenants.models import Tenant

log = logging.getLogger(__name__)

CANCELLED_MESSAGE = "The batch was cancelled at your request; nothing was charged for this item."

_JOBS = Job._meta.db_table
_ITEMS = BatchItem._meta.db_table
_BATCHES = Batch._meta.db_table
_q = connection.ops.quote_name

# The claim's extra condition (`synthesis.job_rows.claim_guard_register`), on
# the job row being claimed: not an item of a batch being or already cancelled.
CLAIM_GUARD_SQL = (
    f"NOT ({_JOBS}.{_q('in_batch')} AND EXISTS ("
    f"SELECT 1 FROM {_ITEMS} i JOIN {_BATCHES} b ON b.id = i.batch_id "
    f"WHERE i.job_id = {_JOBS}.id "
    f"AND b.status IN ('{BatchStatus.CANCELLING.value}', '{BatchStatus.CANCELLED.value}')))"
)

_STOP_SQL = f"""
UPDATE {_JOBS}
SET status = %s, error_code = %s, error_message = %s, finished_at = %s
WHERE status IN (%s, %s, %s) AND id IN (SELECT job_id FROM {_ITEMS} WHERE batch_id = %s)
RETURNING tenant_id, priority
"""


def batch_cancel(*, tenant: Tenant, batch: Batch) -> Batch:
    """Cancel the batch's unfinished items and refund them, and leave the batch
    `cancelling` for a light worker to end. Finished items keep their audio (and
    charge) and go into the archive.

    A batch already `cancelling` is taken on again (its stop repeated, its end
    sent again), as is a `cancelled` one that still has items in flight; one
    that has ended otherwise is refused (409)."""
    with transaction.atomic():
        marked = Batch.objects.filter(
            pk=batch.pk, tenant=tenant, status__in=(BatchStatus.RUNNING, BatchStatus.CANCELLING)
        ).update(status=BatchStatus.CANCELLING)
        unfinished = Exists(
            BatchItem.objects.filter(batch_id=OuterRef("pk"), job__status__in=IN_FLIGHT)
        )
        if not marked and not (
            Batch.objects.filter(pk=batch.pk, tenant=tenant, status=BatchStatus.CANCELLED)
            .filter(unfinished)
            .exists()
        ):
            batch.refresh_from_db()
            raise BatchNotCancellable(
                f"The batch has already ended ({batch.status}); only a running batch can be "
                "cancelled.",
                details={"status": batch.status},
            )
        stopped = _stop_items(batch_id=batch.pk)
        transaction.on_commit(lambda: _send_finish(batch_id=batch.pk))
    _after_stop(stopped)
    log.info("batch %s cancelling: %d unfinished items cancelled", batch.pk, len(stopped))
    batch.refresh_from_db()
    return batch


def batch_cancel_finish(*, batch_id: uuid.UUID) -> bool:
    """End a `cancelling` batch: cancel and refund any item still in flight (one
    admitted or put back in line since), then mark it `cancelled` once none is.
    True if this call ended it. Safe to repeat and to run beside another."""
    with transaction.atomic():
        stopped = _stop_items(batch_id=batch_id)
        unfinished = BatchItem.objects.filter(batch_id=OuterRef("pk"), job__status__in=IN_FLIGHT)
        ended = (
            Batch.objects.filter(pk=batch_id, status=BatchStatus.CANCELLING)
            .filter(~Exists(unfinished))
            .update(status=BatchStatus.CANCELLED, finished_at=timezone.now())
        )
        if ended:
            transaction.on_commit(lambda: batch_ended(batch_id=batch_id))
    _after_stop(stopped)
    return bool(ended)


def _stop_items(*, batch_id: uuid.UUID) -> list[tuple[int, str]]:
    """Cancel the batch's items in flight and refund every cancelled item not yet
    settled; (tenant, priority) of each item cancelled. Call in a transaction."""
    params = [
        JobStatus.CANCELLED.value,
        "cancelled",
        CANCELLED_MESSAGE,
        Job._meta.get_field("finished_at").get_db_prep_value(timezone.now(), connection),
        *IN_FLIGHT,
        Batch._meta.pk.get_db_prep_value(batch_id, connection),  # type: ignore[union-attr]
    ]
    with connection.cursor() as cursor:
        cursor.execute(_STOP_SQL, params)
        stopped = [(tenant_id, priority) for tenant_id, priority in cursor.fetchall()]
    # Every cancelled item, not only these: an item cancelled by a pass that
    # died before its refund is refunded now; one refunded already is left.
    quota_refund_cancelled(
        job_ids=Job.objects.filter(
            batch_item__batch_id=batch_id, status=JobStatus.CANCELLED
        ).values("pk")
    )
    return stopped


def _after_stop(stopped: list[tuple[int, str]]) -> None:
    """Once the stop committed: count the items cancelled, and let the tenant's
    next pending jobs into the broker slots its queued items held."""
    for _, priority in stopped:
        metrics.observe_job_finished(priority=priority, status="cancelled", code="cancelled")
    for tenant_id, priority in sorted(set(stopped)):
        admission_refill(tenant_id=tenant_id, priority=priority)


def _send_finish(*, batch_id: uuid.UUID) -> None:
    from batches.tasks import finish_cancel_task

    try:
        finish_cancel_task.apply_async(args=(str(batch_id),))
    except Exception:  # the sweeper ends it (`batches.sweeper`)
        log.exception("could not enqueue the end of cancelled batch %s", batch_id)
