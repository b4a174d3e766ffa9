"""The per-tenant lock that serializes a tenant's admissions.

Taken first in every transaction that needs it (then the usage period), and as
FOR NO KEY UPDATE: a plain FOR UPDATE would also block the foreign-key checks
PostgreSQL runs at commit for rows that point at the tenant (ledger entries,
jobs), which turns two ordinary transactions into a deadlock.

On PostgreSQL its holder also holds a shared advisory lock on the tenant, which
shows that someone holds the lock to a reader who must not wait for it
(`tenant_lock_held`): a row lock can be seen only by taking one, which writes
the row and makes the reader's transaction one that must flush its commit.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import OperationalError, transaction

from chorus.statements import Rows, Statement, execute_together
from tenants.models import Tenant

# In SQL: taken on every submit, where the ORM's query (every column, a model
# built and thrown away) cost more CPU than the lock. SQLite has no row locks
# (its writes are serialized anyway) and no FOR clause.
_LOCK_SQL = f"SELECT 1 FROM {Tenant._meta.db_table} WHERE id = %s FOR NO KEY UPDATE"


# Chorus's advisory lock keys: this prefix in the high 32 bits, the tenant's id in
# the low ones.
_ADVISORY_PREFIX = 0x43484F52 << 32  # "CHOR"
_HOLD_SHARED_SQL = "SELECT pg_advisory_xact_lock_shared(%s)"
_TRY_EXCLUSIVE_SQL = "SELECT NOT pg_try_advisory_xact_lock(%s)"
_WAIT_SQL = "SELECT pg_advisory_xact_lock(%s)"
_LOCK_TIMEOUT_SQL = "SELECT set_config('lock_timeout', %s, true)"  # for this transaction
_LOCK_NOT_AVAILABLE = "55P03"


def _advisory_key(tenant_id: int) -> int:
    assert 0 < tenant_id < 1 << 32, tenant_id
    return _ADVISORY_PREFIX | tenant_id


def tenant_lock_held(tenant_id: int) -> Statement:
    """A read of whether anyone holds the tenant's lock at that moment (one row,
    one boolean), which never waits. It does not take the lock; it holds off
    those who would take it until its transaction ends, so send it in a short
    one (`execute_together` in autocommit: the string's implicit transaction).
    PostgreSQL only: SQLite has no such locks, and runs each write transaction
    alone anyway."""
    return Statement(_TRY_EXCLUSIVE_SQL, [_advisory_key(tenant_id)], "tenant_lock_held")


def tenant_lock_wait(tenant_id: int, *, timeout_s: float) -> bool:
    """Wait until no transaction holds the tenant's lock: what it wrote is then
    committed, or rolled back. Taken and let go of in one short transaction of
    its own (call it outside a transaction). False when it is still held after
    `timeout_s`. PostgreSQL only."""
    assert not transaction.get_connection().in_atomic_block, "wait outside a transaction"
    try:
        with transaction.atomic():
            execute_together(
                [
                    Statement(_LOCK_TIMEOUT_SQL, [f"{round(timeout_s * 1000)}ms"], "lock_timeout"),
                    Statement(_WAIT_SQL, [_advisory_key(tenant_id)], "tenant_lock_wait"),
                ]
            )
    except OperationalError as error:
        if getattr(error.__cause__, "sqlstate", None) == _LOCK_NOT_AVAILABLE:
            return False
        raise
    return True


def tenant_lock_held_by_row(*, table: str, row_id: object, name: str) -> Statement:
    """`tenant_lock_held` for the tenant of the row `row_id` of `table` (its
    `tenant_id`): for a string of statements that has not read the tenant yet.
    `name` names the prepared statement (one per table)."""
    return Statement(
        f"SELECT NOT pg_try_advisory_xact_lock(%s::bigint | tenant_id) FROM {table} WHERE id = %s",
        [_ADVISORY_PREFIX, row_id],
        name,
    )


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
    lock = [
        Statement(_LOCK_SQL, [tenant_id], "tenant_lock"),
        Statement(_HOLD_SHARED_SQL, [_advisory_key(tenant_id)], "tenant_lock_shown"),
    ]
    return execute_together([*lock, *reads])[len(lock) :]
