"""Who waits for a lock, as the database sees it: for tests that hold a
transaction open across another's step and must know when that step waits."""

from __future__ import annotations

from django.db import connection


def lock_waiters() -> int:
    """Backends of this database waiting for a lock (a row lock, here); on
    SQLite, which has no such view, none (the caller waits on its own)."""
    if connection.vendor != "postgresql":
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return int(cursor.fetchone()[0])
