"""Cancelling a batch: answered at once, finished in the background in chunks.

The request does a bounded amount of work whatever the batch's size: it marks
the batch `cancelling` and, in the same transaction, cancels and refunds the
items that are queued or running (a handful: fair admission lets only a few of
a tenant's jobs into the broker, and running ones are at most one per worker),
so the GPUs stop on them at once. From that commit on, no item of the batch
starts: the claim refuses an item whose batch is `cancelling` or `cancelled`
(`CLAIM_GUARD_SQL`), so a pending item released into the broker meanwhile, or
admitted late, is skipped. A light worker then cancels and refunds the pending
rest, `CHUNK` items per transaction (a statement for the items and one for
their refunds: `quotas.refunds`), and ends the batch (`cancelled`, the
`batch_completed` signal, the archive: `batch_cancel_finish`). The sweeper does
the same for a batch whose task was lost (a web process killed after the
commit, a broker restart), so a cancel is never left half done; a second
cancel of a `cancelling` batch goes on the same way.

Each item is refunded once: its status changes from in-flight to `cancelled`
in the statement that picks it, and the ledger's one settlement per job holds
against a single cancel or the sweeper's settlement repair racing this.
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
from batches.publishers import send_batch_cancel_finish
from chorus import metrics
from quotas.refunds import quota_refund_cancelled
from synthesis.job_lifecycle import Event, transition_sql
from synthesis.models import IN_FLIGHT, Job, JobStatus
from synthesis.services.dispatch import admission_refill
from tenants.models import Tenant

log = logging.getLogger(__name__)

# Items cancelled and refunded per transaction: it holds their rows' locks (on
# SQLite, the database's write lock) for well under a second on a busy host.
CHUNK = 500

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

# The items are picked once, in a materialized CTE (a LIMIT inside `id IN (...)`
# may be run again by PostgreSQL's plan, as `synthesis.job_rows` found). The
# cancel is `synthesis.job_lifecycle`'s, in bulk: its SET and from-statuses.
_STOP_SQL = """
WITH picked AS MATERIALIZED (
    SELECT i.job_id FROM {items} i JOIN {jobs} ON {jobs}.id = i.job_id
    WHERE i.batch_id = %s AND {cancel.where_of}
    LIMIT %s
)
UPDATE {jobs}
SET {cancel.set}, error_code = %s, error_message = %s, finished_at = %s
WHERE {cancel.where} AND id IN (SELECT job_id FROM picked)
RETURNING id, tenant_id, priority
"""


def batch_cancel(*, tenant: Tenant, batch: Batch) -> Batch:
    """Cancel the batch: its queued and running items stopped and refunded now,
    the rest by a light worker, which then ends it. Finished items keep their
    audio (and charge) and go into the archive. Answers with the batch
    `cancelling`.

    A batch already `cancelling` is taken on again, as is a `cancelled` one that
    still has items in flight; one that has ended otherwise is refused (409)."""
    with transaction.atomic():
        marked = Batch.objects.filter(
            pk=batch.pk, tenant=tenant, status__in=(BatchStatus.RUNNING, BatchStatus.CANCELLING)
        ).update(status=BatchStatus.CANCELLING)
        unfinished = BatchItem.objects.filter(batch_id=OuterRef("pk"), job__status__in=IN_FLIGHT)
        if not marked and not (
            Batch.objects.filter(pk=batch.pk, tenant=tenant, status=BatchStatus.CANCELLED)
            .filter(Exists(unfinished))
            .exists()
        ):
            batch.refresh_from_db()
            raise BatchNotCancellable(
                f"The batch has already ended ({batch.status}); only a running batch can be "
                "cancelled.",
                details={"status": batch.status},
            )
        stopped = _stop_chunk(batch_id=batch.pk, statuses=(JobStatus.QUEUED, JobStatus.RUNNING))
        transaction.on_commit(lambda: _send_finish(batch_id=batch.pk))
    _count(stopped)
    log.info("batch %s cancelling: %d queued or running items stopped", batch.pk, len(stopped))
    batch.refresh_from_db()
    return batch


def batch_cancel_finish(*, batch_id: uuid.UUID, max_chunks: int | None = None) -> bool:
    """Cancel and refund the batch's items still in flight, `CHUNK` per
    transaction, then end it (`cancelling` -> `cancelled`) once none is left.
    True if this call ended it. `max_chunks` bounds the work of one call (the
    sweeper's). Safe to repeat and to run beside another."""
    stopped: list[tuple[int, str]] = []
    chunks = 0
    while max_chunks is None or chunks < max_chunks:
        with transaction.atomic():
            chunk = _stop_chunk(batch_id=batch_id, statuses=IN_FLIGHT)
        _count(chunk)
        stopped += chunk
        chunks += 1
        if len(chunk) < CHUNK:
            break
    unfinished = BatchItem.objects.filter(batch_id=OuterRef("pk"), job__status__in=IN_FLIGHT)
    with transaction.atomic():
        ended = (
            Batch.objects.filter(pk=batch_id, status=BatchStatus.CANCELLING)
            .filter(~Exists(unfinished))
            .update(status=BatchStatus.CANCELLED, finished_at=timezone.now())
        )
        if ended:
            transaction.on_commit(lambda: batch_ended(batch_id=batch_id))
    # The broker slots its queued items held go to the tenant's next pending
    # jobs, now that none of them is this batch's.
    for tenant_id, priority in sorted(set(stopped)):
        admission_refill(tenant_id=tenant_id, priority=priority)
    return bool(ended)


def _stop_chunk(*, batch_id: uuid.UUID, statuses: tuple[str, ...]) -> list[tuple[int, str]]:
    """Cancel up to `CHUNK` of the batch's items in `statuses` and refund them;
    (tenant, priority) of each. Call in a transaction."""
    cancel = transition_sql(Event.CANCELLED, statuses=statuses)
    params = [
        Batch._meta.pk.get_db_prep_value(batch_id, connection),  # type: ignore[union-attr]
        CHUNK,
        "cancelled",
        CANCELLED_MESSAGE,
        Job._meta.get_field("finished_at").get_db_prep_value(timezone.now(), connection),
    ]
    with connection.cursor() as cursor:
        cursor.execute(_STOP_SQL.format(items=_ITEMS, jobs=_JOBS, cancel=cancel), params)
        rows = cursor.fetchall()
    job_id = Job._meta.pk.to_python  # type: ignore[union-attr]
    quota_refund_cancelled(job_ids=[job_id(row[0]) for row in rows])
    return [(tenant_id, priority) for _, tenant_id, priority in rows]


def _count(stopped: list[tuple[int, str]]) -> None:
    for _, priority in stopped:
        metrics.observe_job_finished(priority=priority, status="cancelled", code="cancelled")


def _send_finish(*, batch_id: uuid.UUID) -> None:
    try:
        send_batch_cancel_finish(str(batch_id))
    except Exception:  # the sweeper finishes it (`batches.sweeper`)
        log.exception("could not enqueue the end of cancelled batch %s", batch_id)
