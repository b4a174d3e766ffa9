"""Character quota: reserve at submit, commit on success, refund on failure or
cancel — each exactly once, recorded in a ledger keyed by job.

Admission runs under a row lock on the tenant's current usage period, so a
burst of submissions from one tenant is admitted one at a time and the checks
(characters left, jobs in flight) cannot race. Settlement relies on the
ledger's unique constraints: a second commit or refund of a job is a no-op.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime

from django.db import IntegrityError, transaction
from django.db.models import Sum
from django.utils import timezone

from chorus.statements import Rows, Statement, execute_together
from quotas.counters import audio_ms, storage_add, storage_used
from quotas.errors import QuotaExceeded, StorageQuotaExceeded, TooManyConcurrentJobs
from quotas.models import LedgerEntry, LedgerKind, UsagePeriod
from quotas.period_lock import (
    period_from_rows,
    period_locked,
    period_reserve,
    period_reserve_many,
    period_statement,
    reserve_statements,
)
from quotas.periods import billing_period
from quotas.plans import Limits
from quotas.settlement import (
    period_settle,
    reservation_grow,
    reservation_of,
    settlement_write,
)
from tenants.models import Tenant


def tenant_anchor(tenant: Tenant) -> date:
    return tenant.billing_anchor or tenant.created_at.astimezone(UTC).date()


def usage_period_current(*, tenant: Tenant, now: datetime | None = None) -> UsagePeriod:
    starts_at, ends_at = billing_period(tenant_anchor(tenant), now or timezone.now())
    period = UsagePeriod.objects.filter(tenant=tenant, starts_at=starts_at).first()
    if period is not None:
        return period
    try:
        with transaction.atomic():
            return UsagePeriod.objects.create(tenant=tenant, starts_at=starts_at, ends_at=ends_at)
    except IntegrityError:  # another request created it first
        return UsagePeriod.objects.get(tenant=tenant, starts_at=starts_at)


@dataclass(frozen=True)
class PeriodRead:
    """The read of the tenant's current period that `quota_admit` starts with, for
    a caller that runs it in the round trip of the tenant's lock
    (`tenants.locks.tenant_lock_then`) and hands its rows back with `with_rows`."""

    tenant_id: int
    now: datetime
    starts_at: datetime
    statement: Statement
    rows: Rows | None = None

    def with_rows(self, rows: Rows | None) -> PeriodRead:
        return replace(self, rows=rows)


def quota_period_read(*, tenant: Tenant) -> PeriodRead:
    now = timezone.now()
    starts_at, _ = billing_period(tenant_anchor(tenant), now)
    statement = period_statement(tenant_id=tenant.pk, starts_at=starts_at)
    return PeriodRead(tenant_id=tenant.pk, now=now, starts_at=starts_at, statement=statement)


def quota_admit(
    *,
    tenant: Tenant,
    limits: Limits,
    characters: int,
    in_flight: int,
    period_read: PeriodRead | None = None,
) -> UsagePeriod:
    """Lock the period and check every submit-time limit. Call inside the
    transaction that creates the job, then `quota_reserve` the job.

    `in_flight`: the tenant's single jobs in flight, counted by the caller under
    the tenant's lock (`synthesis.services.dispatch.tenant_line`);
    a batch's items pass 0, as they skip the jobs-at-once limit: the batch's own
    limits bound them, and fair admission keeps them from flooding the broker.
    `period_read`: the period as the caller read it (`quota_period_read`)."""
    assert transaction.get_connection().in_atomic_block
    # One query in the common case (none when the caller brings it): the period
    # exists, locked as it is read, and the storage counter rides along.
    if period_read is None:
        read = quota_period_read(tenant=tenant)
        [rows] = execute_together([read.statement])
        period_read = read.with_rows(rows)
    assert period_read.tenant_id == tenant.pk
    period = period_from_rows(period_read.rows)
    if period is None:
        # The tenant's first submit this period.
        usage_period_current(tenant=tenant, now=period_read.now)
        period = period_locked(tenant_id=tenant.pk, starts_at=period_read.starts_at)
        assert period is not None
    if in_flight >= limits.max_concurrent_jobs:
        raise TooManyConcurrentJobs(
            f"You have {in_flight} jobs queued or running; your plan allows "
            f"{limits.max_concurrent_jobs} at once. Wait for one to finish.",
            details={"limit": limits.max_concurrent_jobs, "value": in_flight},
        )
    committed = period.characters_used + period.characters_reserved
    if committed + characters > limits.monthly_characters:
        raise QuotaExceeded(
            f"This job needs {characters} characters but only "
            f"{max(0, limits.monthly_characters - committed)} are left this month.",
            details={
                "limit": limits.monthly_characters,
                "used": period.characters_used,
                "reserved": period.characters_reserved,
                "requested": characters,
                "resets_at": period.ends_at.isoformat(),
            },
        )
    counter: int | None = period.stored  # type: ignore[attr-defined]
    # No counter yet: storage_used opens the tenant's first one, by a recount.
    stored = max(0, counter) if counter is not None else storage_used(tenant_id=tenant.pk)
    if stored >= limits.storage_bytes:
        raise StorageQuotaExceeded(
            f"Your storage is full ({stored} of {limits.storage_bytes} bytes). "
            "Delete voices or wait for old audio to expire.",
            details={"limit": limits.storage_bytes, "value": stored},
        )
    return period


def quota_reserve(*, period: UsagePeriod, job_id: uuid.UUID | str, characters: int) -> None:
    period_reserve(period=period, job_id=job_id, characters=characters)


def quota_reserve_many(
    *, period: UsagePeriod, reservations: Sequence[tuple[uuid.UUID, int]]
) -> None:
    """`quota_reserve` of many jobs at once, (job id, characters) each (a
    batch's items): one reservation per job, each settled on its own, and the
    period moved once by their sum."""
    period_reserve_many(period=period, reservations=reservations)


def quota_reserve_statements(
    *, period: UsagePeriod, job_id: uuid.UUID | str, characters: int
) -> list[Statement]:
    """`quota_reserve`'s statements, to run with the job's INSERT (`chorus.statements`)."""
    return reserve_statements(period=period, job_id=job_id, characters=characters)


def quota_commit(*, job_id: uuid.UUID | str) -> bool:
    """Charge a job's reserved characters. True if this call charged them."""
    return _settle(job_id=job_id, kind=LedgerKind.COMMIT)


def quota_refund(*, job_id: uuid.UUID | str) -> bool:
    """Release a job's reserved characters. True if this call released them."""
    return _settle(job_id=job_id, kind=LedgerKind.REFUND)


def quota_commit_part(*, job_id: uuid.UUID | str, characters: int) -> bool:
    """Charge `characters` of a job's reservation and release the rest: a
    long-form job cancelled part-way pays for the segments that had started.
    Counted as the job's final status (cancelled), with no audio."""
    return _settle(job_id=job_id, kind=LedgerKind.COMMIT, characters=characters)


def quota_commit_spoken(*, job_id: uuid.UUID | str, characters: int) -> bool:
    """Charge the `characters` a realtime session sent to its engine and release
    the rest of its reservation (text reserved ahead, or refused by a cancel);
    counted as a success with its audio."""
    return _settle(job_id=job_id, kind=LedgerKind.COMMIT, characters=characters, succeeded=True)


def quota_reserve_more(
    *, tenant: Tenant, limits: Limits, job_id: uuid.UUID | str, needed: int, ahead: int = 0
) -> int:
    """Grow a running job's reservation (a realtime session's text, as it
    arrives) by at least `needed` characters and, where the month has them, up
    to `ahead` more, so that the next small appends need no write. Raises
    `QuotaExceeded` when fewer than `needed` are left; the characters added."""
    with transaction.atomic():
        reservation = reservation_of(job_id=job_id)
        if reservation is None:
            raise ValueError(f"job {job_id} has no reservation to grow")
        period = UsagePeriod.objects.select_for_update(no_key=True).get(pk=reservation.period_id)
        left = limits.monthly_characters - period.characters_used - period.characters_reserved
        if left < needed:
            raise QuotaExceeded(
                f"This text needs {needed} characters but only {max(0, left)} are left this month.",
                details={
                    "limit": limits.monthly_characters,
                    "used": period.characters_used,
                    "reserved": period.characters_reserved,
                    "requested": needed,
                    "resets_at": period.ends_at.isoformat(),
                },
            )
        grant = min(max(needed, ahead), left)
        reservation_grow(job_id=job_id, period_id=period.pk, characters=grant)
    return grant


def _settle(
    *,
    job_id: uuid.UUID | str,
    kind: LedgerKind,
    characters: int | None = None,
    succeeded: bool = False,
) -> bool:
    """Call after the job reached its final state, in the same transaction: the
    period counts the job's outcome, and a success adds its audio to storage."""
    reservation = reservation_of(job_id=job_id)
    if reservation is None:
        return False
    n = reservation.characters
    settled = n if characters is None else characters
    if not settlement_write(reservation=reservation, job_id=job_id, kind=kind, characters=settled):
        return False  # already committed or refunded
    counts: dict[str, int]
    if kind == LedgerKind.COMMIT and characters is not None and succeeded:
        counts = {
            "characters_used": min(characters, n),
            "jobs_succeeded": 1,
            "audio_ms": audio_ms(reservation.job_duration_s),
        }
    elif kind == LedgerKind.COMMIT and characters is not None:
        counts = {"characters_used": min(characters, n), "jobs_cancelled": 1}
    elif kind == LedgerKind.COMMIT:
        counts = {
            "characters_used": n,
            "jobs_succeeded": 1,
            "audio_ms": audio_ms(reservation.job_duration_s),
        }
    elif reservation.job_status == "cancelled":
        counts = {"jobs_cancelled": 1}
    else:
        counts = {"jobs_failed": 1}
    period_settle(period_id=reservation.period_id, released=n, counts=counts)
    if kind == LedgerKind.COMMIT and not reservation.job_output_deleted:
        storage_add(tenant_id=reservation.tenant_id, delta=reservation.job_output_bytes or 0)
    return True


def ledger_total(*, tenant: Tenant, kind: LedgerKind) -> int:
    total = LedgerEntry.objects.filter(tenant=tenant, kind=kind).aggregate(n=Sum("characters"))
    return int(total["n"] or 0)
