"""A job's settlement in plain SQL: its reservation read, the commit or refund
written to the ledger, and the period's counters moved.

These run for every job that ends. Written with the ORM (a joined `only()`
query, a model save in a savepoint, F() updates) they cost the worker more CPU
than PostgreSQL spent running them. The ledger's unique constraints still make
a settlement happen once: the INSERT does nothing on a conflict (no savepoint
to roll back), and the counters move only when it wrote a row. The statements
run on PostgreSQL and SQLite alike.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Field
from django.utils import timezone

from chorus.statements import Statement, execute_together
from quotas.models import LedgerEntry, LedgerKind, UsagePeriod

_LEDGER = LedgerEntry._meta.db_table
_JOBS = LedgerEntry._meta.get_field("job").related_model._meta.db_table  # type: ignore[union-attr]
_PERIODS = UsagePeriod._meta.db_table

# Prepared statements (`chorus.statements`); the reserve kind is written into the
# text, so the generic plan can use the one-reservation-per-job partial index.
_RESERVATION_SQL = f"""
SELECT r.tenant_id, r.period_id, r.characters,
       j.status, j.duration_s, j.output_bytes, j.output_deleted_at
FROM {_LEDGER} r JOIN {_JOBS} j ON j.id = r.job_id
WHERE r.job_id = %s AND r.kind = '{LedgerKind.RESERVE.value}'
"""

_SETTLE_SQL = f"""
INSERT INTO {_LEDGER} (tenant_id, period_id, job_id, kind, characters, created_at)
VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT DO NOTHING
RETURNING 1
"""

# Counters the period may move, by name: nothing else is ever spliced into SQL.
_COUNTERS = frozenset(
    ("characters_used", "jobs_succeeded", "jobs_failed", "jobs_cancelled", "audio_ms")
)


@dataclass(frozen=True)
class Reservation:
    tenant_id: int
    period_id: int
    characters: int
    job_status: str
    job_duration_s: float | None
    job_output_bytes: int | None
    job_output_deleted: bool


def reservation_of(*, job_id: uuid.UUID | str) -> Reservation | None:
    """The job's reservation with what its settlement needs of the job, or None."""
    [rows] = execute_together(
        [Statement(_RESERVATION_SQL, [_prep("job", job_id)], "ledger_reservation")]
    )
    if not rows:
        return None
    [(tenant_id, period_id, characters, status, duration_s, output_bytes, deleted_at)] = rows
    return Reservation(
        tenant_id=tenant_id,
        period_id=period_id,
        characters=characters,
        job_status=status,
        job_duration_s=duration_s,
        job_output_bytes=output_bytes,
        job_output_deleted=deleted_at is not None,
    )


def settlement_write(
    *, reservation: Reservation, job_id: uuid.UUID | str, kind: LedgerKind, characters: int
) -> bool:
    """The job's one settlement in the ledger; False if it already has one."""
    now: datetime = timezone.now()
    values = [
        reservation.tenant_id,
        reservation.period_id,
        _prep("job", job_id),
        kind.value,
        characters,
        _prep("created_at", now),
    ]
    [rows] = execute_together([Statement(_SETTLE_SQL, values, "ledger_settle")])
    return bool(rows)


def reservation_grow(*, job_id: uuid.UUID | str, period_id: int, characters: int) -> None:
    """Add `characters` to a job's reservation and to its period's reserved count
    (the caller holds the period's lock and has checked the month's limit)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {_LEDGER} SET characters = characters + %s "
            f"WHERE job_id = %s AND kind = '{LedgerKind.RESERVE.value}'",
            [characters, _prep("job", job_id)],
        )
        cursor.execute(
            f"UPDATE {_PERIODS} SET characters_reserved = characters_reserved + %s WHERE id = %s",
            [characters, period_id],
        )


def period_settle(*, period_id: int, released: int, counts: dict[str, int]) -> None:
    """Release `released` reserved characters (never below zero: a counter
    changed by hand must not make every later settlement fail on the column's
    check) and add `counts` to the period's counters."""
    assert set(counts) <= _COUNTERS, counts
    sets = [
        "characters_reserved = CASE WHEN characters_reserved > %s "
        "THEN characters_reserved - %s ELSE 0 END"
    ]
    params: list[int] = [released, released]
    for name, n in counts.items():
        sets.append(f"{name} = {name} + %s")
        params.append(n)
    sql = f"UPDATE {_PERIODS} SET {', '.join(sets)} WHERE id = %s"
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, period_id])


def _prep(name: str, value: object) -> Any:
    field = LedgerEntry._meta.get_field(name)
    assert isinstance(field, Field)
    return field.get_db_prep_value(value, connection)
