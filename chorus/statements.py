"""Several SQL statements in one round trip to PostgreSQL.

A submit makes a handful of small statements, each a round trip whose fixed cost
(the driver and Django's wrappers, a wake-up on each side, the server's protocol
work) is larger than the statement's own. Sent as one string they travel by the
simple-query protocol, and PostgreSQL runs them one after another exactly as it
would separate executes: under READ COMMITTED each takes its own snapshot when
it starts, so a read placed after a lock that had to wait sees what the lock's
holder committed meanwhile. SQLite (in-process, no round trips) runs them one
by one.

Django's PostgreSQL cursor binds parameters on the client (psycopg's
`ClientCursor`), which is what lets one execute carry several statements.

**Named statements are planned once per connection.** Most of what PostgreSQL
spends on a submit's small statements is planning them, not running them: the
job table's seventeen indexes, six of them partial, are weighed for every
statement (a reuse probe: 0.22 ms of the server's CPU as sent, 0.06 ms as an
`EXECUTE` of a prepared statement). A `Statement` with a `name` is prepared on
each pooled connection the first time that connection meets it (one round trip
of its own, once) and sent as `EXECUTE name(...)` from then on, still in the same
string as the others. Prepared statements belong to the server's session and
survive a rolled-back transaction, so a connection's record of them stays true;
after five runs PostgreSQL keeps the generic plan where it costs no more than a
planned one. Only SQL whose text never changes gets a name (values go in as
parameters), so a connection holds a handful of them; constants that decide a
partial index's use are written into the text, not passed, or the generic plan
could not use that index. `CHORUS_DB_PREPARED_STATEMENTS=false` sends every
statement as written (behind a pooler in transaction mode, which moves a
session's transactions between server connections).
"""

from __future__ import annotations

import functools
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.conf import settings
from django.db import NotSupportedError, connection
from django.db.models import Model
from psycopg import pq

Rows = list[tuple[Any, ...]]
M = TypeVar("M", bound=Model)


@dataclass(frozen=True)
class Statement:
    """SQL with `%s` placeholders and their values. `name`: prepare it on
    PostgreSQL (above); one name, one SQL text, whatever the values."""

    sql: str
    params: Sequence[Any] = field(default_factory=tuple)
    name: str = ""


def execute_together(statements: Sequence[Statement]) -> list[Rows | None]:
    """Run `statements` in order; each one's rows, or None for one that returns
    none (an INSERT, an UPDATE). The first that fails stops the rest and raises."""
    if not statements:
        return []
    with connection.cursor() as cursor:
        if connection.vendor != "postgresql":
            results: list[Rows | None] = []
            for statement in statements:
                cursor.execute(statement.sql, statement.params)
                results.append(_rows(cursor))
            return results
        prepared = settings.DB_PREPARED_STATEMENTS
        begin = _begin_here()
        sql = ";\n".join(_sent_sql(s) if prepared else s.sql for s in statements)
        try:
            if prepared:
                _prepare(cursor, [s for s in statements if s.name])
            cursor.execute(
                f"{begin};\n{sql}" if begin else sql,
                [p for s in statements for p in s.params],
            )
        except BaseException as error:
            _driver_begins_again()
            if isinstance(error, NotSupportedError) and prepared and _plan_outdated(error):
                _outdated.add(connection.connection)
            raise
        _driver_begins_again()
        if begin:
            cursor.nextset()  # past BEGIN's own result
        results = [_result_rows(cursor)]
        while cursor.nextset():
            results.append(_result_rows(cursor))
    assert len(results) == len(statements), "one result per statement"
    return results


# Ends the transaction a string of statements runs in (PostgreSQL).
COMMIT = Statement("COMMIT")


def _begin_here() -> str:
    """The BEGIN to send first with these statements when they are the first of
    an atomic block's transaction (psycopg then sends none of its own); "" when
    they are not.

    Inside `transaction.atomic()` psycopg starts the transaction with a BEGIN
    of its own before the first statement: a round trip that carries nothing
    (on a submit, one of three to PostgreSQL before the job is queued). Sent
    first in the same string, BEGIN travels with the statements instead. psycopg
    must then not send its own, so the driver's connection is put in autocommit
    mode (the server's transaction, opened by that BEGIN, is what counts: psycopg's
    commit and rollback act on the server's transaction status, not on that flag,
    so the block's end commits or rolls back as before, and Django turns
    autocommit back on there in any case). The BEGIN names the isolation level
    psycopg's would (`chorus.snapshot`); a read-only or deferrable one stays
    psycopg's."""
    # Only in a block that turned autocommit off to open its transaction, and
    # turns it back on when it ends (not a caller's own `set_autocommit(False)`).
    if not (connection.in_atomic_block and connection.commit_on_exit):
        return ""
    raw = connection.connection
    if (
        raw.autocommit
        or raw.info.transaction_status != pq.TransactionStatus.IDLE
        or raw.read_only is not None
        or raw.deferrable is not None
    ):
        return ""
    raw.autocommit = True
    if raw.isolation_level is None:
        return "BEGIN"
    return f"BEGIN ISOLATION LEVEL {raw.isolation_level.name.replace('_', ' ')}"


def _driver_begins_again() -> None:
    """After any string inside an atomic block whose BEGIN a string carried: once
    the server has no transaction open (this string or a later one ended it with
    its COMMIT, or it failed before the server opened it: psycopg refused a value,
    a PREPARE failed, the connection broke), psycopg goes back to starting one
    itself, so that anything the block still runs is in a transaction, as without
    this. While that transaction is open the flag stays on (so a server-side
    cursor declared meanwhile is WITH HOLD: Django asks for one in autocommit)."""
    if not (connection.in_atomic_block and connection.commit_on_exit):
        return
    raw = connection.connection
    if (
        raw is not None
        and not raw.closed
        and raw.autocommit
        and raw.info.transaction_status == pq.TransactionStatus.IDLE
    ):
        raw.autocommit = False


def execute_and_commit(statements: Sequence[Statement]) -> list[Rows | None]:
    """`execute_together`, then the COMMIT of the transaction around it, in the
    same round trip: for the last statements of an outermost
    `transaction.atomic()` block, which then runs no more SQL. Django's commit
    at the block's end finds no transaction open (psycopg then sends nothing)
    and runs the block's `on_commit` callbacks as always. On a submit this is
    one round trip fewer on the way to a stream's first audio.

    If a statement fails, the ones after it, the COMMIT included, do not run
    (PostgreSQL skips the rest of the string) and the block rolls back as usual.
    On SQLite, or inside an outer block (a savepoint's release is no commit),
    this is `execute_together` and the block commits itself."""
    if connection.vendor != "postgresql" or not commits_at_block_end():
        return execute_together(statements)
    return execute_together([*statements, COMMIT])[:-1]


def commits_at_block_end() -> bool:
    """Whether the atomic block this runs in is the one Django commits at its end:
    the outermost, opened in autocommit mode (one opened with autocommit turned
    off by hand commits nothing; an inner one releases a savepoint)."""
    return (
        connection.in_atomic_block
        and len(connection.atomic_blocks) == 1
        and connection.commit_on_exit
        and not connection.savepoint_ids
    )


# What each name stands for in this process, and the names each PostgreSQL
# connection (the driver's, which the pool lends again and again) has prepared.
_named: dict[str, str] = {}
_prepared: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
# Connections whose prepared statements a schema change outdated: they drop
# them all and prepare again at their next use.
_outdated: weakref.WeakSet[Any] = weakref.WeakSet()


def _prepare(cursor: Any, statements: Sequence[Statement]) -> None:
    """Prepare, in one round trip, those of `statements` this connection has not."""
    for statement in statements:
        known = _named.setdefault(statement.name, statement.sql)
        assert known == statement.sql, f"statement {statement.name} names two SQL texts"
    raw = connection.connection
    done = _prepared.setdefault(raw, set())
    sql = []
    if raw in _outdated:
        sql.append("DEALLOCATE ALL")
        done.clear()
    missing = {s.name: s.sql for s in statements if s.name not in done}
    sql += [f"PREPARE {_prepared_name(n)} AS {_numbered(text)}" for n, text in missing.items()]
    if not sql:
        return
    cursor.execute(";\n".join(sql))
    _outdated.discard(raw)
    done.update(missing)


def _plan_outdated(error: NotSupportedError) -> bool:
    """A prepared SELECT whose result columns a migration changed (a column's
    type): PostgreSQL refuses to run it until it is prepared again. The request
    that meets it fails; the connection's next use prepares afresh (web processes
    still running the old code through a deploy keep working)."""
    cause = error.__cause__
    return getattr(cause, "sqlstate", None) == "0A000" and "cached plan" in str(cause)


def _sent_sql(statement: Statement) -> str:
    if not statement.name:
        return statement.sql
    return _execute_sql(statement.name, len(statement.params))


@functools.cache
def _execute_sql(name: str, count: int) -> str:
    """`EXECUTE` of a named statement with `count` values: built once per name,
    not on every run (this is every submit's and every poll's path)."""
    marks = f"({', '.join(['%s'] * count)})" if count else ""
    return f"EXECUTE {_prepared_name(name)}{marks}"


def _prepared_name(name: str) -> str:
    assert re.fullmatch(r"[a-z_][a-z0-9_]*", name), f"a plain lowercase name: {name!r}"
    return f"chorus_{name}"


@functools.cache
def _numbered(sql: str) -> str:
    """`%s` placeholders as PostgreSQL's own `$1, $2, ...` (and `%%` as `%`)."""
    count = 0

    def number(match: re.Match[str]) -> str:
        nonlocal count
        if match.group() == "%%":
            return "%"
        count += 1
        return f"${count}"

    return re.sub(r"%%|%s", number, sql)


def _rows(cursor: Any) -> Rows | None:
    """The current result's rows; None for a statement that returns none."""
    return cursor.fetchall() if cursor.description is not None else None


# The results psycopg gives a description: those that carry rows.
_WITH_ROWS = frozenset(
    {pq.ExecStatus.TUPLES_OK, pq.ExecStatus.SINGLE_TUPLE, pq.ExecStatus.TUPLES_CHUNK}
)


def _result_rows(cursor: Any) -> Rows | None:
    """`_rows` for psycopg, read from the result's status as psycopg's own
    `description` decides. That property builds a column object for every column
    only to be compared with None: 50 us for a job's row (41 columns), on every
    result of a claim, a submit and a poll."""
    result = cursor.cursor.pgresult
    has_rows = result is not None and (result.nfields or result.status in _WITH_ROWS)
    return cursor.fetchall() if has_rows else None


def insert_statement(instance: Model) -> Statement:
    """The INSERT of a new row whose primary key is set in Python (a UUID), for
    `execute_together`; once it has run, `inserted(instance)`. Every column's
    value is prepared as `save()` prepares it (`pre_save`, so `auto_now_add` too,
    then `get_db_prep_save`); nothing is returned and no save signal is sent.
    The ORM's compiler took a tenth of a submit's CPU building this statement."""
    assert instance.pk is not None, "the primary key is set before the INSERT"
    fields = instance._meta.local_concrete_fields
    values = [f.get_db_prep_save(f.pre_save(instance, True), connection) for f in fields]
    table = instance._meta.db_table
    return Statement(_insert_sql(type(instance), connection.vendor), values, f"insert_{table}")


@functools.cache
def _insert_sql(model: type[Model], vendor: str) -> str:
    quote = connection.ops.quote_name
    fields = model._meta.local_concrete_fields
    assert not any(hasattr(f, "get_placeholder") for f in fields), "a plain %s per column"
    columns = ", ".join(quote(f.column) for f in fields)
    marks = ", ".join(["%s"] * len(fields))
    return f"INSERT INTO {quote(model._meta.db_table)} ({columns}) VALUES ({marks})"


# Rows in one multi-row INSERT at most; fewer where the database binds fewer
# values in one statement (Django counts 999 on SQLite).
INSERT_ROWS = 500


def insert_many(model: type[Model], rows: Sequence[dict[str, Any]]) -> None:
    """Insert `rows`, each {column's attname: its value already converted for
    the database (`get_db_prep_save`)}, every row with the same names: many rows
    built before a transaction and sent inside it, where `bulk_create` would
    build and convert them while the transaction holds its locks.

    PostgreSQL takes them by COPY: a multi-row INSERT's text, with a
    placeholder per value, is parsed by psycopg in Python, not cached past a
    few KB, at 1 s per 100,000 values. SQLite binds natively: multi-row INSERTs."""
    if not rows:
        return
    names = list(rows[0])
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    columns = ", ".join(quote(model._meta.get_field(n).column or n) for n in names)  # type: ignore[union-attr]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            with cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row([row[n] for n in names])
            return
        marks = f"({', '.join(['%s'] * len(names))})"
        most = connection.features.max_query_params or INSERT_ROWS * len(names)
        per_statement = max(1, min(INSERT_ROWS, most // len(names)))
        for start in range(0, len(rows), per_statement):
            chunk = rows[start : start + per_statement]
            values = ", ".join([marks] * len(chunk))
            cursor.execute(
                f"INSERT INTO {table} ({columns}) VALUES {values}",
                [row[n] for row in chunk for n in names],
            )


def inserted(instance: Model) -> None:
    """Mark `instance` as saved, as `save()` would once its INSERT has run."""
    instance._state.adding = False
    instance._state.db = connection.alias


@functools.cache
def select_columns(model: type[Model], vendor: str) -> str:
    """The model's concrete columns, table-qualified, in the order
    `model_from_row` reads them: a SELECT written once per model."""
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    return ", ".join(f"{table}.{quote(f.column)}" for f in model._meta.concrete_fields)


def model_from_row(model: type[M], row: Sequence[Any]) -> M:
    """An instance of `model` from a row of its concrete fields' columns, in the
    order of `model._meta.concrete_fields`, converted as the ORM converts them
    (SQLite's text timestamps become aware datetimes)."""
    values = []
    for (expression, converters), value in zip(
        _converters(model, connection.vendor), row, strict=True
    ):
        for convert in converters:
            value = convert(value, expression, connection)
        values.append(value)
    return model.from_db(connection.alias, [f.attname for f in model._meta.concrete_fields], values)


@functools.cache
def _converters(model: type[Model], vendor: str) -> list[tuple[Any, list[Any]]]:
    """Each concrete field's column and the converters its values go through."""
    found = []
    for column in model._meta.concrete_fields:
        expression = column.get_col(model._meta.db_table)
        converters = connection.ops.get_db_converters(expression)
        found.append((expression, [*converters, *expression.get_db_converters(connection)]))
    return found
