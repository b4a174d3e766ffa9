"""A tenant's effective limits: its plan, with any per-tenant overrides applied."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, fields
from typing import Any

from tenants.models import LIMIT_NAMES, Tenant
from tenants.models import validate_overrides as validate_overrides  # where it was


@dataclass(frozen=True)
class Limits:
    monthly_characters: int
    max_text_chars: int
    max_longform_chars: int
    requests_per_minute: int
    max_concurrent_jobs: int
    voice_slots: int
    max_upload_bytes: int
    min_reference_seconds: float
    max_reference_seconds: float
    allowed_priorities: tuple[str, ...]
    link_ttl_seconds: int
    output_retention_days: int
    storage_bytes: int


# The plan's fields a tenant's overrides may replace are named where the tenant
# checks them (`tenants.models`, below this app): the same names, in this order.
assert tuple(f.name for f in fields(Limits)) == LIMIT_NAMES


def tenant_limits(tenant: Tenant) -> Limits:
    plan = tenant.plan
    values: dict[str, Any] = {name: getattr(plan, name) for name in LIMIT_NAMES}
    # Only the plan's limits: overrides may also hold switches (`provenance`).
    values.update({k: v for k, v in (tenant.limit_overrides or {}).items() if k in LIMIT_NAMES})
    values["allowed_priorities"] = tuple(values["allowed_priorities"])
    return Limits(**values)


def tenants_by_retention() -> dict[int, list[int]]:
    """Tenant ids by the days their plan keeps audio (overrides included): what
    expires is found one retention at a time, off the finished-at indexes."""
    grouped: dict[int, list[int]] = defaultdict(list)
    for tenant in Tenant.objects.select_related("plan"):
        grouped[tenant_limits(tenant).output_retention_days].append(tenant.pk)
    return dict(sorted(grouped.items()))


@dataclass(frozen=True)
class BatchLimits:
    max_items: int  # items in one batch
    max_characters: int  # characters of all its items together


def tenant_batch_limits(tenant: Tenant) -> BatchLimits:
    """The plan's batch limits. A batch's items are also each bound by
    `max_text_chars`, and all of them together by the characters left this month."""
    plan = tenant.plan
    return BatchLimits(max_items=plan.batch_max_items, max_characters=plan.batch_max_characters)


@dataclass(frozen=True)
class RealtimeLimits:
    max_sessions: int  # realtime sessions open at once
    max_seconds: int  # a session's longest life
    max_characters: int  # text one session may send
    idle_timeout_s: int  # a session with no text for this long is closed


def tenant_realtime_limits(tenant: Tenant) -> RealtimeLimits:
    """The plan's realtime limits. A session's text also counts against the
    characters left this month, reserved as it arrives."""
    plan = tenant.plan
    return RealtimeLimits(
        max_sessions=plan.max_realtime_sessions,
        max_seconds=plan.max_session_seconds,
        max_characters=plan.max_session_characters,
        idle_timeout_s=plan.realtime_idle_timeout_s,
    )
