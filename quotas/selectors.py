from __future__ import annotations

from datetime import date, datetime
from typing import Any

from django.db.models import Count, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from quotas.counters import storage_used
from quotas.models import LedgerEntry, LedgerKind, UsagePeriod
from quotas.periods import billing_period
from quotas.plans import tenant_limits
from quotas.services import tenant_anchor, usage_period_current
from tenants.models import Tenant

# `synthesis.models.IN_FLIGHT`, by value: quotas sits below synthesis.
IN_FLIGHT_STATUSES = ("pending", "queued", "running")


def usage_summary(*, tenant: Tenant, at: datetime | None = None) -> dict[str, Any]:
    """What `GET /v1/usage` and the admin show: the period containing `at` (the
    current one by default) at a glance.

    Jobs finished in the period and their audio come from the period's counters,
    which outlive the job rows (row retention prunes those); jobs in flight now
    are few (the plan caps them) and are counted live for the current period, off
    the tenant's own index (not the queue's, which holds every tenant's). Voices
    and storage are always as they are now."""
    limits = tenant_limits(tenant)
    now = timezone.now()
    current = usage_period_current(tenant=tenant)
    by_status = {status: 0 for status in IN_FLIGHT_STATUSES}
    if at is None or current.starts_at <= at < current.ends_at:
        period = current
        in_flight = (
            # A long text's segments are internal: its job counts once.
            tenant.jobs.filter(status__in=IN_FLIGHT_STATUSES, parent__isnull=True)
            .order_by()
            .values_list("status")
            .annotate(n=Count("id"))
        )
        by_status.update(dict(in_flight))
    else:
        period = usage_period_at(tenant=tenant, at=min(at, now))
    by_status.update(
        succeeded=period.jobs_succeeded,
        failed=period.jobs_failed,
        cancelled=period.jobs_cancelled,
    )
    return {
        "period": {"starts_at": period.starts_at, "ends_at": period.ends_at},
        "characters": {
            "used": period.characters_used,
            "reserved": period.characters_reserved,
            "limit": limits.monthly_characters,
            "remaining": max(
                0, limits.monthly_characters - period.characters_used - period.characters_reserved
            ),
            "resets_at": period.ends_at,
        },
        "jobs": by_status,
        "audio_seconds": round(period.audio_ms / 1000, 3),
        "voices": {"used": tenant.voices.count(), "limit": limits.voice_slots},
        "storage_bytes": {"used": storage_used(tenant_id=tenant.pk), "limit": limits.storage_bytes},
    }


def usage_period_at(*, tenant: Tenant, at: datetime) -> UsagePeriod:
    """The tenant's period containing `at`; one with no usage (no row was ever
    opened for it) reads as zeros, and is not created."""
    starts_at, ends_at = billing_period(tenant_anchor(tenant), at)
    period = UsagePeriod.objects.filter(tenant=tenant, starts_at=starts_at).first()
    return period or UsagePeriod(tenant=tenant, starts_at=starts_at, ends_at=ends_at)


def daily_characters(*, tenant: Tenant, since: date) -> list[tuple[date, int]]:
    """Characters charged per day (committed jobs), for the admin chart."""
    rows = (
        LedgerEntry.objects.filter(
            tenant=tenant, kind=LedgerKind.COMMIT, created_at__date__gte=since
        )
        .annotate(day=TruncDate("created_at"))
        .values_list("day")
        .annotate(n=Sum("characters"))
        .order_by("day")
    )
    return [(day, int(n)) for day, n in rows]
