"""The per-tenant lock that serializes a tenant's admissions.

Taken first in every transaction that needs it (then the usage period), and as
FOR NO KEY UPDATE: a plain FOR UPDATE would also block the foreign-key checks
PostgreSQL runs at commit for rows that point at the tenant (ledger entries,
jobs), which turns two ordinary transactions into a deadlock.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import transaction

from chorus.statements import Rows, Statement, execute_together
from tenants.models import Tenant

# In SQL: taken on every submit, where the ORM's query (every column, a model
# built and thrown away) cost more CPU than the lock. SQLite has no row locks
# (its writes are serialized anyway) and no FOR clause.
_LOCK_SQL = f"SELECT 1 FROM {Tenant._meta.db_table} WHERE id = %s FOR NO KEY UPDATE"


def tenant_lock(tenant_id: int) -> None:
    tenant_lock_then(tenant_id, [])


def tenant_lock_then(tenant_id: int, reads: Sequence[Statement]) -> list[Rows | None]:
    """Take the tenant's lock, then run `reads` under it: one round trip on
    PostgreSQL (`chorus.statements`; each read's snapshot is taken after the
    lock is held, so it sees what the lock's previous holder committed). Each
    read's rows, in order."""
    connection = transaction.get_connection()
    assert connection.in_atomic_block, "lock inside a transaction"
    if connection.vendor != "postgresql":
        return execute_together(reads)
    return execute_together([Statement(_LOCK_SQL, [tenant_id], "tenant_lock"), *reads])[1:]
