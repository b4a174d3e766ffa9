from __future__ import annotations

from datetime import date
from typing import Any

from django.db.models import Count, Sum
from django.db.models.functions import TruncDate

from quotas.counters import storage_used
from quotas.models import LedgerEntry, LedgerKind
from quotas.plans import tenant_limits
from quotas.services import usage_period_current
from tenants.models import Tenant

# `synthesis.models.IN_FLIGHT`, by value: quotas sits below synthesis.
IN_FLIGHT_STATUSES = ("pending", "queued", "running")


def usage_summary(*, tenant: Tenant) -> dict[str, Any]:
    """What `GET /v1/usage` and the admin show: the current period at a glance.

    Jobs finished this period and their audio come from the period's counters;
    jobs in flight now are few (the plan caps them) and are counted live, off the
    tenant's own index (not the queue's, which holds every tenant's)."""
    limits = tenant_limits(tenant)
    period = usage_period_current(tenant=tenant)
    in_flight = (
        # A long text's segments are internal: its job counts once.
        tenant.jobs.filter(status__in=IN_FLIGHT_STATUSES, parent__isnull=True)
        .order_by()
        .values_list("status")
        .annotate(n=Count("id"))
    )
    by_status = {status: 0 for status in IN_FLIGHT_STATUSES}
    by_status.update(dict(in_flight))
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
