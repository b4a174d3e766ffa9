"""The benches' own tenants: slugs `bench-...`, deleted by the next run.

A module of its own, with nothing done at import: `harness` sets the database
and Redis defaults of the scheduling benches when imported, which a bench that
runs on SQLite (no DATABASE_URL) must not inherit.
"""

from __future__ import annotations


def forget_bench_tenants() -> None:
    """Delete the tenants earlier runs made (slugs `bench-...`) with their audit
    trail. A tenant with audit events cannot be deleted (the events keep it), and
    the events are append-only: on PostgreSQL a trigger refuses their DELETE unless
    the transaction says it is the retention prune (`audit` migration 0002). A
    bench's database is its own, so its runs' events go as a prune's would."""
    from django.db import transaction

    from audit.models import AuditEvent
    from audit.services import audit_allow_prune
    from tenants.models import Tenant

    with transaction.atomic():
        audit_allow_prune()
        AuditEvent.objects.filter(tenant__slug__startswith="bench-").delete()
        Tenant.objects.filter(slug__startswith="bench-").delete()
