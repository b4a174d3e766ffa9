from __future__ import annotations

from datetime import date
from typing import Any

from django.db.models import Count, Sum
from django.db.models.functions import TruncDate

from quotas.models import LedgerEntry, LedgerKind
from quotas.plans import tenant_limits
from quotas.services import usage_period_current
from tenants.models import Tenant


def usage_summary(*, tenant: Tenant) -> dict[str, Any]:
    """What `GET /v1/usage` and the admin show: the current period at a glance."""
    from synthesis.models import Job, JobStatus, Voice
    from synthesis.selectors import storage_bytes_used

    limits = tenant_limits(tenant)
    period = usage_period_current(tenant=tenant)
    jobs = Job.objects.filter(
        tenant=tenant, created_at__gte=period.starts_at, created_at__lt=period.ends_at
    )
    by_status = {status: 0 for status in JobStatus.values}
    by_status.update(dict(jobs.values_list("status").annotate(n=Count("id"))))
    audio = jobs.filter(status=JobStatus.SUCCEEDED).aggregate(s=Sum("duration_s"))["s"] or 0.0
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
        "audio_seconds": round(float(audio), 3),
        "voices": {
            "used": Voice.objects.filter(tenant=tenant).count(),
            "limit": limits.voice_slots,
        },
        "storage_bytes": {"used": storage_bytes_used(tenant=tenant), "limit": limits.storage_bytes},
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
