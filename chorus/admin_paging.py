"""Admin lists of tables that grow without end (jobs, the ledger).

Django's changelist counts every row of the list (and, by default, of the
unfiltered table as well) on each page view: at a million jobs that is most of
a second per page. Unfiltered, PostgreSQL's own row estimate (`reltuples`, kept
by autovacuum) is shown instead; a filtered or searched list still counts its
rows exactly, through the indexes its filter uses.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from django.core.paginator import Paginator
from django.db import connections

# Below this many rows an exact count is cheap, and exact is nicer.
ESTIMATE_ABOVE = 10_000


class EstimatedCountPaginator(Paginator):
    @cached_property
    def count(self) -> int:
        queryset: Any = self.object_list
        estimate = _table_estimate(queryset) if not queryset.query.where else None
        if estimate is not None and estimate > ESTIMATE_ABOVE:
            return estimate
        return int(super().count)


def _table_estimate(queryset: Any) -> int | None:
    connection = connections[queryset.db]
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
            [queryset.model._meta.db_table],
        )
        row = cursor.fetchone()
    return int(row[0]) if row and row[0] >= 0 else None
