"""Reads that must agree with each other.

Under PostgreSQL's default isolation (read committed) each statement sees the
rows committed when it starts, so a worker's claim that commits between two
reads of one answer is half seen: a job's place in line, computed from a count
of the waiting jobs per tenant and the list of queued ones, came out one too
high for that moment. `one_snapshot` runs the reads in one REPEATABLE READ
transaction: every statement sees the same committed state.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import transaction


@contextmanager
def one_snapshot() -> Iterator[None]:
    connection = transaction.get_connection()
    # SQLite serialises writers and readers already; inside a transaction the
    # isolation is its owner's (and can no longer be changed).
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield
