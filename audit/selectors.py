from __future__ import annotations

from datetime import datetime

from django.db.models import QuerySet

from audit.models import AuditEvent


def audit_event_list(
    *,
    tenant_id: int,
    types: list[str] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[AuditEvent]:
    """A tenant's events; `since` inclusive, `until` exclusive."""
    events = AuditEvent.objects.filter(tenant_id=tenant_id)
    if types:
        events = events.filter(type__in=types)
    if since is not None:
        events = events.filter(created_at__gte=since)
    if until is not None:
        events = events.filter(created_at__lt=until)
    return events
