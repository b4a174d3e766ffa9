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
from psycopg import IsolationLevel, pq


@contextmanager
def one_snapshot() -> Iterator[None]:
    connection = transaction.get_connection()
    # SQLite serialises writers and readers already; inside a transaction the
    # isolation is its owner's (and can no longer be changed).
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        yield
        return
    # The level goes in the transaction's BEGIN (psycopg's, or the one sent with
    # the first reads, `chorus.statements`), not in a statement of its own: a
    # poll's round trips were BEGIN, SET TRANSACTION, its reads and COMMIT.
    connection.ensure_connection()
    driver = connection.connection
    level = driver.isolation_level
    driver.isolation_level = IsolationLevel.REPEATABLE_READ
    try:
        with transaction.atomic():
            yield
    finally:
        # The pool lends the connection on: with its own level, or not at all
        # (and `chorus.db_backend` sets the level again on every lend).
        if driver.closed or connection.connection is not driver:
            pass  # Django gave it back already (a failed rollback closes it)
        elif driver.info.transaction_status == pq.TransactionStatus.IDLE:
            driver.isolation_level = level
        else:  # the block's end failed, and the level cannot be changed now
            driver.close()
            connection.close()
