"""Write the audit trail, and prune it past each plan's retention."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.apps import apps
from django.db import connection, transaction
from django.utils import timezone

from audit.context import current_origin
from audit.models import AuditEvent, EventType

# Events of no one tenant (a plan changed) are kept as long as a plan's default.
DEFAULT_RETENTION_DAYS = 365

# Most events one sweep pass deletes (a batch per statement, an index on
# (tenant, created_at) finds them): a backlog after a retention cut goes in steps.
PRUNE_BATCH = 2000
PRUNE_STATEMENT = 500


def audit_record(
    *,
    type: EventType,
    tenant_id: int | None,
    target: str = "",
    data: dict[str, Any] | None = None,
) -> AuditEvent:
    """Record an event in the caller's transaction: call it inside the
    `transaction.atomic` that makes the change, so both commit or neither."""
    origin = current_origin()
    return AuditEvent.objects.create(
        tenant_id=tenant_id,
        type=type,
        actor=origin.actor,
        target=target,
        request_id=origin.request_id,
        source_ip=origin.source_ip,
        data=data or {},
    )


def changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, list[Any]]:
    """The fields whose values differ, as name: [before, after]."""
    return {name: [before[name], after[name]] for name in after if before.get(name) != after[name]}


def audit_prune(*, limit: int = PRUNE_BATCH) -> int:
    """Delete events older than their tenant's plan keeps them (`audit_retention_days`),
    at most `limit` per call, oldest first; returns how many."""
    now = timezone.now()
    plan_model = apps.get_model("tenants", "Plan")
    horizons = [
        (days, {"tenant__plan__audit_retention_days": days})
        for days in plan_model.objects.values_list("audit_retention_days", flat=True).distinct()
    ]
    horizons.append((DEFAULT_RETENTION_DAYS, {"tenant__isnull": True}))
    deleted = 0
    for days, which in horizons:
        expired = AuditEvent.objects.filter(
            created_at__lt=now - timedelta(days=days), **which
        ).order_by("created_at")
        while deleted < limit:
            ids = list(
                expired.values_list("pk", flat=True)[: min(PRUNE_STATEMENT, limit - deleted)]
            )
            if not ids:
                break
            with transaction.atomic():
                audit_allow_prune()
                count, _ = AuditEvent.objects.filter(pk__in=ids).delete()
            deleted += count
    return deleted


def audit_allow_prune() -> None:
    """Open the trigger's one door (migration 0002) for this transaction only: the
    retention prune's, and a bench's that deletes its own tenants."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL chorus.audit_prune = 'on'")
