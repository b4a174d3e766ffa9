"""A tenant's effective limits: its plan, with any per-tenant overrides applied."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, fields
from typing import Any

from django.core.exceptions import ValidationError

from tenants.models import PRIORITIES, Tenant


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


LIMIT_NAMES = tuple(f.name for f in fields(Limits))


def tenant_limits(tenant: Tenant) -> Limits:
    plan = tenant.plan
    values: dict[str, Any] = {name: getattr(plan, name) for name in LIMIT_NAMES}
    values.update(tenant.limit_overrides or {})
    values["allowed_priorities"] = tuple(values["allowed_priorities"])
    return Limits(**values)


def tenants_by_retention() -> dict[int, list[int]]:
    """Tenant ids by the days their plan keeps audio (overrides included): what
    expires is found one retention at a time, off the finished-at indexes."""
    grouped: dict[int, list[int]] = defaultdict(list)
    for tenant in Tenant.objects.select_related("plan"):
        grouped[tenant_limits(tenant).output_retention_days].append(tenant.pk)
    return dict(sorted(grouped.items()))


def validate_overrides(overrides: Any) -> None:
    """Refuse overrides the admin could mistype: unknown names, wrong types, negatives."""
    if not isinstance(overrides, dict):
        raise ValidationError("Overrides must be a JSON object.")
    for name, value in overrides.items():
        if name not in LIMIT_NAMES:
            raise ValidationError(f"Unknown limit {name!r}; use one of {', '.join(LIMIT_NAMES)}.")
        if name == "allowed_priorities":
            # Items are checked one by one: set() of a list holding lists or
            # objects would raise TypeError (a 500 in the admin) instead. Empty is
            # refused as on the plan: it would refuse every submission.
            if not isinstance(value, list) or not value or any(p not in PRIORITIES for p in value):
                raise ValidationError(
                    f"allowed_priorities must be a non-empty list of {PRIORITIES}."
                )
        elif isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValidationError(f"{name} must be a non-negative number.")


@dataclass(frozen=True)
class BatchLimits:
    max_items: int  # items in one batch
    max_characters: int  # characters of all its items together


def tenant_batch_limits(tenant: Tenant) -> BatchLimits:
    """The plan's batch limits. A batch's items are also each bound by
    `max_text_chars`, and all of them together by the characters left this month."""
    plan = tenant.plan
    return BatchLimits(max_items=plan.batch_max_items, max_characters=plan.batch_max_characters)
