"""A tenant's usage period on the submit path: read under its row lock with the
storage counter, and a job's reservation written to it.

These run on every submit. Written with the ORM (a locking query with an
annotated subquery; a model save and an F() update) they cost the web process
more CPU than PostgreSQL spent running them, so the statements are written out
here, once, in SQL that PostgreSQL and SQLite both run.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Field
from django.utils import timezone

from chorus.statements import (
    Rows,
    Statement,
    execute_together,
    insert_many,
    model_from_row,
)
from quotas.models import LedgerEntry, LedgerKind, StorageUsage, UsagePeriod

_PERIOD_COLUMNS = ", ".join(f"p.{f.column}" for f in UsagePeriod._meta.concrete_fields)
_SQL = f"""
SELECT {_PERIOD_COLUMNS},
       (SELECT s.bytes_used FROM {StorageUsage._meta.db_table} s
        WHERE s.tenant_id = p.tenant_id) AS stored
FROM {UsagePeriod._meta.db_table} p
WHERE p.tenant_id = %s AND p.starts_at = %s
"""


def period_statement(*, tenant_id: int, starts_at: datetime) -> Statement:
    """The period starting at `starts_at`, read FOR NO KEY UPDATE (a subquery
    locks nothing) with the tenant's stored bytes; `period_from_rows` reads it."""
    sql = _SQL
    if connection.vendor == "postgresql":  # SQLite has no row locks (nor the clause)
        sql += " FOR NO KEY UPDATE OF p"
    return Statement(
        sql,
        [
            tenant_id,
            UsagePeriod._meta.get_field("starts_at").get_db_prep_value(starts_at, connection),
        ],
        "usage_period_locked",
    )


def period_from_rows(rows: Rows | None) -> UsagePeriod | None:
    """The period of `period_statement`, or None. `stored` on it: the tenant's
    stored bytes, or None before its first storage counter exists."""
    if not rows:
        return None
    [row] = rows
    period = model_from_row(UsagePeriod, row[:-1])
    period.stored = row[-1]  # type: ignore[attr-defined]
    return period


def period_locked(*, tenant_id: int, starts_at: datetime) -> UsagePeriod | None:
    """The period starting at `starts_at`, locked, or None (`period_from_rows`)."""
    [rows] = execute_together([period_statement(tenant_id=tenant_id, starts_at=starts_at)])
    return period_from_rows(rows)


_RESERVE_SQL = """
INSERT INTO {ledger} (tenant_id, period_id, job_id, kind, characters, created_at)
VALUES (%s, %s, %s, %s, %s, %s)
"""
_RESERVED_SQL = "UPDATE {periods} SET characters_reserved = characters_reserved + %s WHERE id = %s"
# PostgreSQL runs both in one statement (SQLite has no data-modifying WITH): a
# round trip less on every submit. A data-modifying WITH runs whether or not the
# main statement reads it.
_RESERVE_AND_COUNT_SQL = "WITH reserved AS (" + _RESERVED_SQL + ")" + _RESERVE_SQL


def reserve_statements(
    *, period: UsagePeriod, job_id: uuid.UUID | str, characters: int
) -> list[Statement]:
    """The job's reservation in the ledger, and the period's reserved count moved
    by as much. Values go through the fields' own conversion (a UUID is text on
    SQLite, a timestamp is adapted per database)."""
    values: list[Any] = [
        period.tenant_id,
        period.pk,
        _prep("job", job_id),
        LedgerKind.RESERVE.value,
        characters,
        _prep("created_at", timezone.now()),
    ]
    tables = {"ledger": LedgerEntry._meta.db_table, "periods": UsagePeriod._meta.db_table}
    if connection.vendor == "postgresql":
        return [
            Statement(
                _RESERVE_AND_COUNT_SQL.format(**tables),
                [characters, period.pk, *values],
                "usage_reservation",
            )
        ]
    return [
        Statement(_RESERVE_SQL.format(**tables), values),
        Statement(_RESERVED_SQL.format(**tables), [characters, period.pk]),
    ]


def period_reserve_many(
    *, period: UsagePeriod, reservations: Sequence[tuple[uuid.UUID, int]]
) -> None:
    """`period_reserve` of many jobs, (job id, characters) each: a ledger row
    per job, as each is settled on its own, inserted together, and the period's
    reserved count moved once by their sum."""
    if not reservations:
        return
    created_at = _prep("created_at", timezone.now())
    insert_many(
        LedgerEntry,
        [
            {
                "tenant_id": period.tenant_id,
                "period_id": period.pk,
                "job_id": _prep("job", job_id),
                "kind": LedgerKind.RESERVE.value,
                "characters": characters,
                "created_at": created_at,
            }
            for job_id, characters in reservations
        ],
    )
    total = sum(characters for _, characters in reservations)
    execute_together(
        [Statement(_RESERVED_SQL.format(periods=UsagePeriod._meta.db_table), [total, period.pk])]
    )


def period_reserve(*, period: UsagePeriod, job_id: uuid.UUID | str, characters: int) -> None:
    execute_together(reserve_statements(period=period, job_id=job_id, characters=characters))


def _prep(name: str, value: object) -> Any:
    field = LedgerEntry._meta.get_field(name)
    assert isinstance(field, Field)
    return field.get_db_prep_value(value, connection)
