"""Periodic repairs: what a crash, a lost message or time leaves behind.

- jobs committed but never published (the web process died before its
  on-commit publish): published;
- pending jobs whose tenant has free broker slots: released (fair admission);
- jobs waiting too long: moved one priority up (aging);
- jobs `running` on a worker that is gone (its process no longer exists on
  this host, or its heartbeat stopped) or stuck past their deadline: requeued
  for another attempt, or failed and refunded once attempts are used up;
- jobs finished within the last 15 minutes whose reservation was never settled:
  committed or refunded;
- audio past the plan's retention: deleted from the bucket, in batches;
- usage counters (storage, jobs per period): recounted for a few tenants per
  pass, and corrected where they drifted;
- Idempotency-Keys older than 24 hours: forgotten;
- webhook deliveries due with no message on the way (a retry hours later, a
  lost message): published; webhook events past their retention: deleted
  (the webhooks app's steps);
- job rows finished before the row retention horizon: pruned with their ledger
  entries, in batches, the periods' totals kept (`synthesis.services.retention`);
- audit events past their plan's `audit_retention_days`: deleted, in batches
  (`audit.services.audit_prune`).
Every repair is a conditional UPDATE, so two sweepers (or a sweeper racing a
worker) cannot apply one twice.
"""

from __future__ import annotations

import logging
import socket
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from audit.services import audit_prune
from chorus.metrics import observe_sweep
from quotas.counters import counters_reconcile, storage_add
from quotas.models import LedgerEntry, LedgerKind
from quotas.plans import tenants_by_retention
from quotas.services import quota_commit, quota_refund
from synthesis.longform.recovery import longform_repair
from synthesis.models import FINISHED, IdempotencyKey, Job, JobStatus
from synthesis.provenance import has_sidecar, sidecar_key
from synthesis.services.dispatch import admission_refill_all, job_publish, jobs_age
from synthesis.services.jobs import IDEMPOTENCY_TTL
from synthesis.services.recovery import (
    job_requeue_lost,
    jobs_republish_lost_messages,
    jobs_requeue_from_dead_workers,
)
from synthesis.services.retention import jobs_prune
from synthesis.signals import sweep_finished
from synthesis.storage_runtime import get_storage
from tenants.models import Tenant

log = logging.getLogger(__name__)

# A running job on a live worker finishes within the task's time limit; one past
# it and this grace is stuck (threads cannot be killed: the attempt is
# superseded, and stops at its next chunk if it ever gets there).
STUCK_GRACE = timedelta(seconds=30)


# A committed job is published within milliseconds; one still unpublished after
# this long lost its publish (the web process died between commit and publish).
UNPUBLISHED_GRACE = timedelta(seconds=30)


@dataclass
class SweepReport:
    published: int = 0
    released: int = 0
    aged: int = 0
    requeued: int = 0
    failed: int = 0
    settled: int = 0
    expired: int = 0
    reconciled: int = 0  # usage counters found wrong and corrected
    webhooks_published: int = 0  # webhook deliveries due, published
    webhooks_forgotten: int = 0  # webhook events past retention, deleted
    pruned: int = 0  # job rows past the row retention horizon, deleted
    audit_pruned: int = 0  # audit events past their plan's retention, deleted


def sweep() -> SweepReport:
    report = SweepReport()
    _publish_lost_jobs(report)
    report.released = admission_refill_all()
    report.aged = jobs_age()
    report.published += jobs_republish_lost_messages()
    report.published += longform_repair()  # a long-form job's lost split or join
    lost = jobs_requeue_from_dead_workers(host=socket.gethostname())
    report.requeued += lost["requeued"]
    report.failed += lost["failed"]
    _rescue_stuck_jobs(report)
    _settle_orphan_reservations(report)
    _expire_outputs(report)
    report.reconciled = counters_reconcile()
    _forget_idempotency_keys()
    report.pruned = jobs_prune()
    report.audit_pruned = audit_prune()
    # Apps above this one (batches, webhooks) do their own repairs and count
    # them into the report.
    sweep_finished.send(sender=SweepReport, report=report)
    observe_sweep(vars(report))
    return report


# Most lost jobs one pass publishes: after a broker lost its data, the backlog
# goes back in steps, oldest first.
REPUBLISH_BATCH = 500


def _publish_lost_jobs(report: SweepReport) -> None:
    """Publish queued jobs whose message never reached the broker, or was lost
    there (acknowledged by a worker that failed before its claim, a broker that
    lost its data). A message still in the broker is then stale: its epoch is old."""
    now = timezone.now()
    never = Q(published_at__isnull=True, created_at__lt=now - UNPUBLISHED_GRACE)
    lost = Q(published_at__lt=now - timedelta(seconds=settings.BROKER_VISIBILITY_TIMEOUT_S))
    due = Job.objects.filter(never | lost, status=JobStatus.QUEUED).order_by("created_at", "id")
    for job in due[:REPUBLISH_BATCH]:
        report.published += int(job_publish(job=job))


# Most Idempotency-Keys one pass forgets (an index on created_at finds them).
IDEMPOTENCY_BATCH = 5000


def _forget_idempotency_keys() -> None:
    expired = IdempotencyKey.objects.filter(
        created_at__lt=timezone.now() - IDEMPOTENCY_TTL
    ).order_by("created_at")
    IdempotencyKey.objects.filter(
        pk__in=list(expired.values_list("pk", flat=True)[:IDEMPOTENCY_BATCH])
    ).delete()


def _rescue_stuck_jobs(report: SweepReport) -> None:
    deadline = timezone.now() - timedelta(seconds=settings.TASK_TIME_LIMIT_S) - STUCK_GRACE
    for job in Job.objects.filter(status=JobStatus.RUNNING, started_at__lt=deadline):
        outcome = job_requeue_lost(job=job)
        report.requeued += int(outcome == "requeued")
        report.failed += int(outcome == "failed")


# Jobs finished this recently are checked for a reservation left unsettled. Every
# path settles in the transaction that ends the job, so an orphan is rare (a
# release before that, a row changed by hand) and is found within a pass or two;
# older history is not scanned again at every pass, nor the last hour's jobs
# (at a hundred jobs a second, 360,000 of them).
ORPHAN_WINDOW = timedelta(minutes=15)
ORPHAN_BATCH = 500


def _settle_orphan_reservations(report: SweepReport) -> None:
    settled = LedgerEntry.objects.filter(
        job=OuterRef("pk"), kind__in=[LedgerKind.COMMIT, LedgerKind.REFUND]
    )
    reserved = LedgerEntry.objects.filter(job=OuterRef("pk"), kind=LedgerKind.RESERVE)
    orphans = Job.objects.filter(
        status__in=FINISHED, finished_at__gte=timezone.now() - ORPHAN_WINDOW
    ).filter(Exists(reserved), ~Exists(settled))
    for job in orphans.order_by().only("pk", "status")[:ORPHAN_BATCH]:
        with transaction.atomic():
            if job.status == JobStatus.SUCCEEDED:
                done = quota_commit(job_id=job.pk)
            else:
                done = quota_refund(job_id=job.pk)
        report.settled += int(done)


# Most outputs one pass expires: a backlog (a retention shortened, a sweeper
# that was down) is worked off over several passes, not in one.
EXPIRY_BATCH = 500


def _expire_outputs(report: SweepReport) -> None:
    """Mark a batch of outputs past their tenant's retention as deleted, free
    their bytes, and delete the objects once that has committed."""
    now = timezone.now()
    buckets = dict(Tenant.objects.values_list("pk", "bucket"))
    room = EXPIRY_BATCH
    expired: list[tuple[int, str]] = []
    for days, tenant_ids in tenants_by_retention().items():
        if room <= 0:
            break
        due = Job.objects.filter(
            status=JobStatus.SUCCEEDED,
            output_deleted_at__isnull=True,
            tenant_id__in=tenant_ids,
            finished_at__lt=now - timedelta(days=days),
        ).order_by("finished_at")  # oldest first, off `job_output_expiry`
        with transaction.atomic():
            # Rows another sweeper holds are its to expire.
            rows = list(
                due.select_for_update(skip_locked=True, no_key=True).values_list(
                    "pk", "tenant_id", "output_key", "output_bytes"
                )[:room]
            )
            if not rows:
                continue
            # Marked first: a link is never handed out for an object about to vanish.
            Job.objects.filter(pk__in=[pk for pk, *_ in rows]).update(output_deleted_at=now)
            freed: dict[int, int] = defaultdict(int)
            for _, tenant_id, _, size in rows:
                freed[tenant_id] += size or 0
            for tenant_id, size in freed.items():
                storage_add(tenant_id=tenant_id, delta=-size)
        expired += [(tenant_id, key) for _, tenant_id, key, _ in rows]
        room -= len(rows)
    storage = get_storage()
    for tenant_id, key in expired:
        try:
            storage.delete(bucket=buckets[tenant_id], key=key)
            if has_sidecar(key):  # its Content Credentials go with it
                storage.delete(bucket=buckets[tenant_id], key=sidecar_key(key))
        except Exception:  # marked deleted; the object is left over, not linked
            log.exception("could not delete %s/%s", buckets[tenant_id], key)
    report.expired += len(expired)
