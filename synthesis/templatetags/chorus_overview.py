"""`{% overview %}`: the operator's overview, rendered above the admin's app list."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone

from synthesis.overview import overview_read
from synthesis.overview_charts import jobs_per_minute, latency_by_priority

register = template.Library()


@register.inclusion_tag("admin/synthesis/overview.html", takes_context=True)
def overview(context: template.Context) -> dict[str, Any]:
    request = context.get("request")
    if request is None or not request.user.has_perm("synthesis.view_job"):
        return {"shown": False}
    data = overview_read()
    return {
        "shown": True,
        "o": data,
        "jobs_chart": jobs_per_minute(data.minutes),
        "latency_chart": latency_by_priority(data.latency),
    }


def duration(seconds: float | None) -> str:
    """2.345 → "2.35 s", 95 → "1 m 35 s", 7300 → "2 h 1 m"."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.3g} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} m {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} m"
    return f"{hours // 24} d {hours % 24} h"


@register.filter
def seconds(value: float | None) -> str:
    return duration(value)


@register.filter
def age(value: datetime | None, now: datetime | None = None) -> str:
    """How long ago `value` was, from `now` (the overview's own clock)."""
    if value is None:
        return "-"
    return duration(max(0.0, ((now or timezone.now()) - value).total_seconds()))


@register.filter
def mib(value: int) -> str:
    return f"{value / 2**20:,.0f} MiB"


@register.filter
def thousands(value: int) -> str:
    return f"{value:,}"
