"""The per-tenant lock that serializes a tenant's admissions.

Taken first in every transaction that needs it (then the usage period), and as
FOR NO KEY UPDATE: a plain FOR UPDATE would also block the foreign-key checks
PostgreSQL runs at commit for rows that point at the tenant (ledger entries,
jobs), which turns two ordinary transactions into a deadlock.
"""

from __future__ import annotations

from django.db import transaction

from tenants.models import Tenant


def tenant_lock(tenant_id: int) -> None:
    assert transaction.get_connection().in_atomic_block, "lock inside a transaction"
    Tenant.objects.select_for_update(no_key=True).filter(pk=tenant_id).first()
