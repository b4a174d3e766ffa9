"""A tenant's usage period read under its row lock, with its storage counter.

Read on every submit. Written with the ORM (a locking query with an annotated
subquery) it cost the web process about as much CPU as the rest of admission's
queries together, so the statement is written out here, once.
"""

from __future__ import annotations

from datetime import datetime

from django.db import connection

from quotas.models import StorageUsage, UsagePeriod

_SQL = """
SELECT p.*, (SELECT s.bytes_used FROM {storage} s WHERE s.tenant_id = p.tenant_id) AS stored
FROM {periods} p
WHERE p.tenant_id = %s AND p.starts_at = %s
"""


def period_locked(*, tenant_id: int, starts_at: datetime) -> UsagePeriod | None:
    """The period starting at `starts_at`, locked FOR NO KEY UPDATE (a subquery
    locks nothing), or None. `stored` on it: the tenant's stored bytes, or None
    before its first storage counter exists."""
    sql = _SQL.format(storage=StorageUsage._meta.db_table, periods=UsagePeriod._meta.db_table)
    if connection.vendor == "postgresql":  # SQLite has no row locks (nor the clause)
        sql += " FOR NO KEY UPDATE OF p"
    for period in UsagePeriod.objects.raw(sql, [tenant_id, starts_at]):
        return period
    return None
