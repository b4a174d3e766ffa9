"""The database's clock: the one clock every host of a deployment reads alike.

Timestamps that are compared across hosts (a job's start, first audio and end,
stamped by a worker, against one another and its submit) are taken by the
database as it writes them, not by the writing host: a worker whose clock runs
3 s ahead would otherwise add 3 s to every queue wait it reports. On the
embedded default (SQLite) the database is a file, and its clock is the clock of
the host every process runs on.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.db import connection
from django.utils.dateparse import parse_datetime

# SQLite's 'now' has millisecond precision (the same expression as Django's
# `Now()` there); PostgreSQL's statement timestamp has microseconds, and unlike
# CURRENT_TIMESTAMP it is not frozen at the start of the transaction.
_NOW_SQL = {
    "postgresql": "STATEMENT_TIMESTAMP()",
    # '%%': statements run with parameters, where a lone '%' is a placeholder's start.
    "sqlite": "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')",
}


def now_sql() -> str:
    """The database's current time, as SQL for a statement run with parameters."""
    return _NOW_SQL[connection.vendor]


def db_now() -> datetime:
    """The database's current time."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {now_sql()}", [])
        (value,) = cursor.fetchone()
    return db_timestamp(value)


def db_timestamp(value: object) -> datetime:
    """A timestamp as the driver returns it, as an aware datetime. SQLite gives
    UTC without a zone: naive, or text for an expression with no column type."""
    if isinstance(value, str):
        value = parse_datetime(value)
    assert isinstance(value, datetime), f"unexpected timestamp {value!r}"
    return value if value.tzinfo else value.replace(tzinfo=UTC)
