"""Admin lists of tables that grow without end (jobs, the ledger).

Django's changelist counts every row of the list (and, by default, of the
unfiltered table as well) on each page view: at a million jobs that is most of
a second per page. Unfiltered, PostgreSQL's own row estimate (`reltuples`, kept
by autovacuum) is shown instead; a filtered or searched list still counts its
rows exactly, through the indexes its filter uses. A list that always filters
(jobs: never a long text's segments) says so in `base_filter`, and shows the
planner's estimate of the rows that filter leaves.
"""

from __future__ import annotations

import json
from functools import cached_property
from typing import Any

from django.core.exceptions import FieldError
from django.core.paginator import Paginator
from django.db import connections

# Below this many rows an exact count is cheap, and exact is nicer.
ESTIMATE_ABOVE = 10_000


class EstimatedCountPaginator(Paginator):
    # The filter every page of the list has (`filter(**base_filter)`), beyond
    # which a list counts as filtered.
    base_filter: dict[str, Any] = {}

    @cached_property
    def count(self) -> int:
        queryset: Any = self.object_list
        estimate = None
        if not queryset.query.where:
            estimate = _table_estimate(queryset)
        elif self.base_filter and queryset.query.where == _where(queryset, self.base_filter):
            estimate = _planner_estimate(queryset)
        if estimate is not None and estimate > ESTIMATE_ABOVE:
            return estimate
        return int(super().count)


def _where(queryset: Any, filters: dict[str, Any]) -> Any:
    try:
        return queryset.model._default_manager.filter(**filters).query.where
    except FieldError:  # an object's history page pages its log entries with this class
        return None


def _planner_estimate(queryset: Any) -> int | None:
    if connections[queryset.db].vendor != "postgresql":
        return None
    plan = json.loads(queryset.order_by().explain(format="json"))
    return int(plan[0]["Plan"]["Plan Rows"])


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
