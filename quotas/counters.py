"""Usage counters kept by the services that change them.

Admission and `GET /v1/usage` read one row (`StorageUsage`, `UsagePeriod`)
instead of summing a tenant's history, which grows with every job it ever ran.
Each counter moves in the transaction that makes the change it counts:

- storage: + a voice's size at create, - at delete; + a job's output when it
  succeeds (its quota commit), - when expiry deletes the audio;
- per period: a job's outcome and audio when its reservation is settled.

A counter that drifts anyway (a row deleted by hand, an older release) is
corrected by the sweeper, which recounts a few tenants per pass, oldest check
first: `counters_reconcile`. Recounts run under the counter's row lock, so a
change committing meanwhile is either seen by the recount or applied after it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.db import IntegrityError, connection, transaction
from django.db.models import Count, F, Q, Sum
from django.db.models.functions import Greatest
from django.utils import timezone

from quotas.models import LedgerEntry, LedgerKind, StorageUsage, UsagePeriod
from tenants.models import Tenant

log = logging.getLogger(__name__)

# Tenants whose counters one sweeper pass recounts, and how long a tenant's
# counters go unchecked at most: a recount reads the tenant's retained audio and
# its month of settlements, so it runs once an hour, not at every pass.
RECONCILE_BATCH = 20
RECONCILE_INTERVAL = timedelta(hours=1)

# Periods that ended this long ago are still recounted: jobs reserved in them
# may settle after the period closed.
RECENT_PERIODS = timedelta(days=7)


def storage_used(*, tenant_id: int) -> int:
    used = StorageUsage.objects.filter(tenant_id=tenant_id).values_list("bytes_used").first()
    if used is None:
        return _storage_open(tenant_id=tenant_id, delta=0)
    return max(0, int(used[0]))


# Written out: it runs for every job that succeeds, where the ORM's F() update
# cost more CPU than the statement. Never below zero, as a recount would say.
_STORAGE_ADD_SQL = f"""
UPDATE {StorageUsage._meta.db_table}
SET bytes_used = CASE WHEN bytes_used + %s > 0 THEN bytes_used + %s ELSE 0 END
WHERE tenant_id = %s
"""


def storage_add(*, tenant_id: int, delta: int) -> None:
    """Move the tenant's stored bytes, after the change itself, in its transaction."""
    if delta == 0:
        return
    with connection.cursor() as cursor:
        cursor.execute(_STORAGE_ADD_SQL, [delta, delta, tenant_id])
        moved = cursor.rowcount
    if not moved:
        _storage_open(tenant_id=tenant_id, delta=delta)


def _storage_open(*, tenant_id: int, delta: int) -> int:
    """The tenant's first counter: a recount, which already sees this
    transaction's own change."""
    total = storage_recount(tenant_id=tenant_id)
    try:
        with transaction.atomic():
            StorageUsage.objects.create(
                tenant_id=tenant_id, bytes_used=total, reconciled_at=timezone.now()
            )
    except IntegrityError:
        # Opened by a transaction that could not see this one's change: add it.
        if delta:
            StorageUsage.objects.filter(tenant_id=tenant_id).update(
                bytes_used=Greatest(F("bytes_used") + delta, 0)
            )
    return total


def storage_recount(*, tenant_id: int) -> int:
    """The full count the counter stands for: voices, retained audio (a partial
    index keeps it to that, not the tenant's history) and ready batch archives."""
    tenant = Tenant(pk=tenant_id)
    voices = tenant.voices.aggregate(n=Sum("size_bytes"))["n"] or 0
    archives = (
        tenant.batches.filter(archive_status="ready").aggregate(n=Sum("archive_bytes"))["n"] or 0
    )
    outputs = (
        tenant.jobs.filter(status="succeeded", output_deleted_at__isnull=True)
        .order_by()
        .aggregate(n=Sum("output_bytes"))["n"]
        or 0
    )
    return int(voices) + int(outputs) + int(archives)


@dataclass(frozen=True)
class Settled:
    jobs_succeeded: int = 0
    jobs_failed: int = 0
    jobs_cancelled: int = 0
    audio_ms: int = 0


def audio_ms(duration_s: float | None) -> int:
    return round((duration_s or 0.0) * 1000)


def period_recount(*, period_id: int) -> Settled:
    """What a period's job counters stand for, from its settlements."""
    rows = (
        LedgerEntry.objects.filter(
            period_id=period_id, kind__in=[LedgerKind.COMMIT, LedgerKind.REFUND]
        )
        .order_by()
        .values_list("kind", "job__status")
        .annotate(n=Count("id"), seconds=Sum("job__duration_s"))
    )
    counts = {"jobs_succeeded": 0, "jobs_failed": 0, "jobs_cancelled": 0, "audio_ms": 0}
    for kind, status, n, seconds in rows:
        # A commit of a cancelled job is a long-form job's partial charge
        # (`quota_commit_part`): counted as cancelled, like its settlement.
        if kind == LedgerKind.COMMIT and status != "cancelled":
            counts["jobs_succeeded"] += n
            counts["audio_ms"] += audio_ms(seconds)
        elif status == "cancelled":
            counts["jobs_cancelled"] += n
        else:
            counts["jobs_failed"] += n
    return Settled(**counts)


def counters_reconcile(*, batch: int = RECONCILE_BATCH) -> int:
    """Recount the counters of up to `batch` tenants not checked for
    `RECONCILE_INTERVAL`, longest ago first, and correct them; returns how many
    counters were wrong."""
    due = Q(reconciled_at__isnull=True) | Q(reconciled_at__lt=timezone.now() - RECONCILE_INTERVAL)
    tenant_ids = list(
        StorageUsage.objects.filter(due)
        .order_by(F("reconciled_at").asc(nulls_first=True), "tenant_id")
        .values_list("tenant_id", flat=True)[:batch]
    )
    corrected = 0
    for tenant_id in tenant_ids:
        corrected += _reconcile_storage(tenant_id=tenant_id)
        periods = UsagePeriod.objects.filter(
            tenant_id=tenant_id, ends_at__gt=timezone.now() - RECENT_PERIODS
        ).values_list("pk", flat=True)
        for period_id in periods:
            corrected += _reconcile_period(period_id=period_id)
    return corrected


def _reconcile_storage(*, tenant_id: int) -> int:
    with transaction.atomic():
        row = StorageUsage.objects.select_for_update().filter(tenant_id=tenant_id).first()
        if row is None:
            return 0
        actual = storage_recount(tenant_id=tenant_id)
        StorageUsage.objects.filter(tenant_id=tenant_id).update(
            bytes_used=actual, reconciled_at=timezone.now()
        )
    if row.bytes_used != actual:
        log.warning(
            "storage counter of tenant %s was %s bytes; recounted %s",
            tenant_id,
            row.bytes_used,
            actual,
        )
        return 1
    return 0


def _reconcile_period(*, period_id: int) -> int:
    # Its own transaction: settlement locks the period before the storage row,
    # so no transaction here holds both.
    with transaction.atomic():
        row = (
            UsagePeriod.objects.select_for_update(no_key=True)
            .filter(pk=period_id)
            .values_list("jobs_succeeded", "jobs_failed", "jobs_cancelled", "audio_ms")
            .first()
        )
        if row is None:
            return 0
        actual = period_recount(period_id=period_id)
        if Settled(*row) == actual:
            return 0
        UsagePeriod.objects.filter(pk=period_id).update(**actual.__dict__)
    log.warning("job counters of usage period %s were %s; recounted %s", period_id, row, actual)
    return 1
