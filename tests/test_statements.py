"""Statements sent together (`chorus.statements`): one round trip on PostgreSQL,
with each statement's own snapshot, rows and errors as separate executes give
(real PostgreSQL; the ones marked `embedded` on SQLite too)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import DatabaseError, NotSupportedError, connection, transaction
from django.test.utils import CaptureQueriesContext
from psycopg import IsolationLevel, pq

from chorus.pg_trace import queries_sent
from chorus.statements import (
    Rows,
    Statement,
    execute_and_commit,
    execute_together,
    insert_statement,
    inserted,
    model_from_row,
)
from quotas.models import UsagePeriod
from quotas.services import usage_period_current
from synthesis.line_counts import line_from_rows, line_statement
from synthesis.models import Job, JobStatus
from tenants.locks import tenant_lock, tenant_lock_held, tenant_lock_then
from tests.conftest import Persona

pytestmark = pytest.mark.django_db(transaction=True)


def a_job(persona: Persona) -> Job:
    return Job(tenant=persona.tenant, text="Hello.", characters=6, status=JobStatus.QUEUED)


@pytest.mark.embedded
def test_each_statement_gives_its_own_rows_in_order(alice: Persona) -> None:
    job = a_job(alice)
    with CaptureQueriesContext(connection) as queries:
        results = execute_together(
            [
                Statement("SELECT 1, %s", ["one"]),
                insert_statement(job),
                Statement(
                    f"SELECT text FROM {Job._meta.db_table} WHERE tenant_id = %s", [alice.tenant.pk]
                ),
            ]
        )
    inserted(job)

    assert results == [[(1, "one")], None, [("Hello.",)]]
    sent = 1 if connection.vendor == "postgresql" else 3
    # (and, the first time this connection meets the INSERT, its PREPARE)
    executed = [q for q in queries.captured_queries if not q["sql"].startswith("PREPARE")]
    assert len(executed) == sent
    read = Job.objects.get(pk=job.pk)
    for column in Job._meta.concrete_fields:  # auto_now_add's created_at included
        assert getattr(read, column.attname) == getattr(job, column.attname), column.name
    assert job.created_at is not None
    assert not job._state.adding


@pytest.mark.embedded
def test_a_statement_gives_rows_exactly_when_it_returns_them(alice: Persona) -> None:
    """A read that finds nothing gives an empty list, a write gives None unless it
    returns rows: on PostgreSQL read from each result's status, as the driver's
    own description would say."""
    job = a_job(alice)
    table, tenant = Job._meta.db_table, alice.tenant.pk
    with transaction.atomic():
        results = execute_together(
            [
                insert_statement(job),
                Statement(f"SELECT id FROM {table} WHERE tenant_id = %s AND 1 = 0", [tenant]),
                Statement(f"UPDATE {table} SET text = %s WHERE tenant_id = %s", ["Hi.", tenant]),
                Statement(
                    f"UPDATE {table} SET characters = %s WHERE tenant_id = %s RETURNING text",
                    [3, tenant],
                ),
                Statement(f"DELETE FROM {table} WHERE tenant_id = %s AND 1 = 0", [tenant]),
            ]
        )

    assert results == [None, [], None, [("Hi.",)], None]
    assert Job.objects.get(pk=job.pk).characters == 3


@pytest.mark.embedded
def test_a_failing_statement_raises_and_the_transaction_keeps_nothing(alice: Persona) -> None:
    job = a_job(alice)
    with pytest.raises(DatabaseError), transaction.atomic():
        execute_together([insert_statement(job), Statement("SELECT * FROM no_such_table")])

    assert not Job.objects.filter(pk=job.pk).exists()


def others_see(job: Job) -> bool:
    """Whether another connection sees the job's row (committed)."""
    seen: list[bool] = []

    def look() -> None:
        try:
            seen.append(Job.objects.filter(pk=job.pk).exists())
        finally:
            connection.close()

    reader = threading.Thread(target=look)
    reader.start()
    reader.join(10)
    return seen == [True]


def test_statements_sent_with_the_commit_are_committed_when_they_return(
    alice: Persona,
) -> None:
    job = a_job(alice)
    committed: list[bool] = []
    with transaction.atomic():
        with CaptureQueriesContext(connection) as queries:
            assert execute_and_commit([Statement("SELECT 1"), insert_statement(job)]) == [
                [(1,)],
                None,
            ]
        inserted(job)
        assert others_see(job)  # before the block's end: its COMMIT went with them
        transaction.on_commit(lambda: committed.append(True))
        assert not committed

    assert committed == [True]  # the block's commit callbacks still run
    sent = [q["sql"] for q in queries.captured_queries if not q["sql"].startswith("PREPARE")]
    assert len(sent) == 1, sent
    assert sent[0].rstrip().endswith("COMMIT"), sent


def test_a_failing_statement_sent_with_the_commit_commits_nothing(alice: Persona) -> None:
    job = a_job(alice)
    with pytest.raises(DatabaseError), transaction.atomic():
        execute_and_commit([insert_statement(job), Statement("SELECT * FROM no_such_table")])

    assert not Job.objects.filter(pk=job.pk).exists()
    assert Job.objects.count() == 0  # and the connection works on


@pytest.mark.embedded
def test_inside_an_outer_block_the_commit_is_the_outer_blocks(alice: Persona) -> None:
    job = a_job(alice)
    with transaction.atomic():
        with transaction.atomic():
            execute_and_commit([insert_statement(job)])
        inserted(job)
        if connection.vendor == "postgresql":  # SQLite's one writer would block the reader
            assert not others_see(job)
    assert Job.objects.filter(pk=job.pk).exists()


@pytest.mark.embedded
def test_a_row_becomes_the_model_the_orm_would_read(alice: Persona) -> None:
    period = usage_period_current(tenant=alice.tenant)
    columns = ", ".join(f.column for f in UsagePeriod._meta.concrete_fields)
    [rows] = execute_together(
        [
            Statement(
                f"SELECT {columns} FROM {UsagePeriod._meta.db_table} WHERE id = %s", [period.pk]
            )
        ]
    )
    assert rows is not None

    read = model_from_row(UsagePeriod, rows[0])

    orm = UsagePeriod.objects.get(pk=period.pk)
    values = {f.attname: getattr(read, f.attname) for f in UsagePeriod._meta.concrete_fields}
    assert values == {f.attname: getattr(orm, f.attname) for f in UsagePeriod._meta.concrete_fields}
    assert read.starts_at.tzinfo is not None  # SQLite's text timestamps converted too


def test_a_read_sent_with_the_tenant_lock_sees_what_the_locks_holder_committed(
    alice: Persona,
) -> None:
    # The point of sending them together safely: the count runs only once the
    # lock is held, with a snapshot taken then, not when the string arrived.
    held, done = threading.Event(), threading.Event()

    def holder() -> None:
        try:
            with transaction.atomic():
                tenant_lock(alice.tenant.pk)
                held.set()
                a_job(alice).save()
                time.sleep(0.5)
        finally:
            connection.close()
            done.set()

    threading.Thread(target=holder, daemon=True).start()
    assert held.wait(10)
    started = time.monotonic()
    with transaction.atomic():
        [rows] = tenant_lock_then(
            alice.tenant.pk, [line_statement(tenant_id=alice.tenant.pk, priority="normal", slots=2)]
        )
    waited = time.monotonic() - started
    assert done.wait(10)

    assert waited > 0.3  # it did wait for the holder
    in_flight, pending, queued = line_from_rows(rows)
    assert (in_flight, pending, queued) == (1, 0, 1)


def test_the_tenant_lock_shows_as_held_while_anyone_holds_it_and_no_longer(
    alice: Persona, bob: Persona
) -> None:
    def held(persona: Persona) -> bool:
        [rows] = execute_together([tenant_lock_held(persona.tenant.pk)])
        return rows == [(True,)]

    holding, release, released = threading.Event(), threading.Event(), threading.Event()

    def holder() -> None:
        try:
            with transaction.atomic():
                tenant_lock(alice.tenant.pk)
                holding.set()
                assert release.wait(10)
        finally:
            connection.close()
            released.set()

    assert not held(alice)
    threading.Thread(target=holder, daemon=True).start()
    assert holding.wait(10)
    started = time.monotonic()
    during = [held(alice), held(bob)]
    looked_in = time.monotonic() - started
    release.set()
    assert released.wait(10)

    assert during == [True, False]  # alice's lock only
    assert looked_in < 1.0  # it did not wait for the holder
    assert not held(alice)
    # The look takes nothing a later lock waits for.
    with transaction.atomic():
        tenant_lock(alice.tenant.pk)


def test_statements_go_as_one_round_trip_on_postgresql(alice: Persona) -> None:
    def lock_and_read() -> list[Rows | None]:
        with transaction.atomic():
            return tenant_lock_then(
                alice.tenant.pk,
                [
                    line_statement(tenant_id=alice.tenant.pk, priority="normal", slots=2),
                    Statement("SELECT 2"),
                ],
            )

    lock_and_read()  # this connection's first use of the named ones prepares them
    with CaptureQueriesContext(connection) as queries:
        results = lock_and_read()

    assert results == [[(0, 0, 0)], [(2,)]]
    sent = [q["sql"] for q in queries.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]
    assert len(sent) == 1, sent


def prepared_here() -> dict[str, tuple[int, int]]:
    """This connection's prepared statements: name -> (generic plans, custom plans)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT name, generic_plans, custom_plans FROM pg_prepared_statements")
        return {name: (generic, custom) for name, generic, custom in cursor.fetchall()}


def fresh_connection() -> None:
    """End this thread's PostgreSQL session for real (not back to the pool), so
    that the next statement runs on a new one, which has prepared nothing."""
    connection.ensure_connection()
    connection.connection.close()
    connection.close()


def test_a_named_statement_is_prepared_once_per_connection_then_executed(
    alice: Persona,
) -> None:
    fresh_connection()
    count = Statement(
        f"SELECT count(*) FROM {Job._meta.db_table} WHERE tenant_id = %s AND text = %s",
        [alice.tenant.pk, "Hello."],
        "test_count",
    )
    a_job(alice).save()

    with CaptureQueriesContext(connection) as first:
        assert execute_together([count]) == [[(1,)]]
    with CaptureQueriesContext(connection) as later:
        for _ in range(6):
            assert execute_together([count, Statement("SELECT 2")]) == [[(1,)], [(2,)]]

    [prepare, execute] = [q["sql"] for q in first.captured_queries]
    assert prepare.startswith("PREPARE chorus_test_count AS SELECT count(*)")
    assert "tenant_id = $1 AND text = $2" in prepare
    assert execute == f"EXECUTE chorus_test_count({alice.tenant.pk}, 'Hello.')"
    assert len(later.captured_queries) == 6  # no PREPARE again: one round trip each
    generic, custom = prepared_here()["chorus_test_count"]
    assert generic >= 1, "PostgreSQL keeps the generic plan once it has tried five"
    assert generic + custom == 7


def test_a_prepared_statement_outlives_a_rolled_back_transaction(alice: Persona) -> None:
    fresh_connection()
    read = Statement("SELECT %s::int + 1", [1], "test_plus_one")

    with pytest.raises(DatabaseError), transaction.atomic():
        execute_together([read, Statement("SELECT * FROM no_such_table")])

    assert "chorus_test_plus_one" in prepared_here()  # PREPARE is not transactional
    assert execute_together([read]) == [[(2,)]]  # so the record of it stays true


def test_a_new_connection_prepares_again(alice: Persona) -> None:
    read = Statement("SELECT %s::text || '%%'", ["a"], "test_percent")
    assert execute_together([read]) == [[("a%",)]]  # `%%` is a literal percent sign

    fresh_connection()

    assert "chorus_test_percent" not in prepared_here()
    assert execute_together([read]) == [[("a%",)]]
    assert "chorus_test_percent" in prepared_here()


def test_one_name_stands_for_one_sql_text(alice: Persona) -> None:
    execute_together([Statement("SELECT 1", name="test_one_text")])

    with pytest.raises(AssertionError, match="names two SQL texts"):
        execute_together([Statement("SELECT 2", name="test_one_text")])


def test_a_submit_runs_its_statements_prepared_with_generic_plans(alice: Persona) -> None:
    for _ in range(8):
        response = alice.client.post("/v1/speech", {"text": "Hello."}, format="json")
        assert response.status_code == 202

    prepared = prepared_here()
    for name in (
        "chorus_tenant_lock",
        "chorus_tenant_line",
        "chorus_usage_period_locked",
        "chorus_reuse_probe",
        "chorus_insert_synthesis_job",
        "chorus_usage_reservation",
    ):
        generic, _ = prepared[name]
        assert generic >= 1, name  # planned once, not on every submit


def test_with_prepared_statements_off_every_statement_goes_as_written(
    alice: Persona, settings: Any
) -> None:
    """Behind a pooler in transaction mode a prepared statement may not exist on
    the server connection the next transaction gets."""
    settings.DB_PREPARED_STATEMENTS = False

    with CaptureQueriesContext(connection) as queries:
        response = alice.client.post("/v1/speech", {"text": "Hello."}, format="json")

    assert response.status_code == 202
    sent = "\n".join(q["sql"] for q in queries.captured_queries)
    assert "PREPARE" not in sent
    assert "EXECUTE" not in sent
    assert "FOR NO KEY UPDATE" in sent


def test_a_statement_a_migration_outdated_is_prepared_afresh(alice: Persona) -> None:
    """A column's type changed under a prepared SELECT (a deploy's migration while
    the old code still runs): the request that meets it fails, the next one works."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE migrated (a integer)")
        cursor.execute("INSERT INTO migrated VALUES (7)")
    read = Statement("SELECT a FROM migrated", [], "test_migrated")
    assert execute_together([read]) == [[(7,)]]
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE migrated ALTER COLUMN a TYPE text")

    with pytest.raises(NotSupportedError, match="cached plan must not change result type"):
        execute_together([read])

    assert execute_together([read]) == [[("7",)]]


class Undone(Exception):
    """Raised at a block's end to roll it back."""


def rolled_back(body: Callable[[], None]) -> None:
    """Run `body` in an atomic block, then fail it: Undone."""
    with transaction.atomic():
        body()
        raise Undone


def raw_state() -> tuple[bool, bool, pq.TransactionStatus]:
    """(Django's autocommit, the driver's, the server's transaction status)."""
    raw = connection.connection
    return connection.get_autocommit(), raw.autocommit, raw.info.transaction_status


def test_a_transaction_sends_its_begin_with_its_first_statements(alice: Persona) -> None:
    job, later = a_job(alice), a_job(alice)
    execute_together([insert_statement(a_job(alice))])  # the INSERT is prepared
    Job.objects.all().delete()

    with queries_sent() as sent, transaction.atomic():
        execute_together([Statement("SELECT 1"), insert_statement(job)])
        inserted(job)
        assert not others_see(job)  # BEGIN opened a transaction the row waits in
        later.save()
        assert not others_see(later)

    assert len(sent) == 3, sent  # no BEGIN of its own before them
    assert sent[0].startswith("BEGIN;\nSELECT 1;\nEXECUTE chorus_insert_synthesis_job(")
    assert sent[1].startswith("INSERT INTO")
    assert sent[2] == "COMMIT"
    assert others_see(job)
    assert others_see(later)
    assert raw_state() == (True, True, pq.TransactionStatus.IDLE)


def test_a_transaction_begun_with_its_statements_rolls_back_whole(alice: Persona) -> None:
    job, later = a_job(alice), a_job(alice)

    def body() -> None:
        execute_together([insert_statement(job)])
        inserted(job)
        later.save()

    with pytest.raises(Undone):
        rolled_back(body)

    assert Job.objects.count() == 0
    assert raw_state() == (True, True, pq.TransactionStatus.IDLE)


def test_a_savepoint_inside_a_transaction_begun_with_its_statements(alice: Persona) -> None:
    kept, undone = a_job(alice), a_job(alice)

    with transaction.atomic():
        execute_together([insert_statement(kept)])
        inserted(kept)
        with contextlib.suppress(Undone):
            rolled_back(undone.save)

    assert list(Job.objects.values_list("pk", flat=True)) == [kept.pk]


def test_a_string_refused_before_it_was_sent_leaves_the_block_transactional(
    alice: Persona,
) -> None:
    """psycopg refused a value, so the BEGIN in the string never reached the
    server: what the block runs after that is still one transaction."""
    later = a_job(alice)

    def body() -> None:
        with pytest.raises(Exception, match="cannot adapt"):
            execute_together([Statement("SELECT %s", [object()])])
        assert raw_state() == (False, False, pq.TransactionStatus.IDLE)
        later.save()

    with queries_sent() as sent, pytest.raises(Undone):
        rolled_back(body)

    assert not Job.objects.filter(pk=later.pk).exists()
    assert sent[0] == "BEGIN"  # psycopg's own, as before


def test_what_a_block_runs_after_a_string_that_began_and_committed_is_transactional(
    alice: Persona,
) -> None:
    committed, later = a_job(alice), a_job(alice)

    def body() -> None:
        execute_and_commit([insert_statement(committed)])
        inserted(committed)
        assert raw_state() == (False, False, pq.TransactionStatus.IDLE)
        later.save()

    with pytest.raises(Undone):
        rolled_back(body)

    assert list(Job.objects.values_list("pk", flat=True)) == [committed.pk]


def test_what_a_block_runs_after_a_later_string_committed_is_transactional(
    alice: Persona,
) -> None:
    """BEGIN went with the first string, COMMIT with another: the driver starts
    the block's next transaction itself again."""
    committed, later = a_job(alice), a_job(alice)

    def body() -> None:
        execute_together([Statement("SELECT 1")])
        execute_and_commit([insert_statement(committed)])
        inserted(committed)
        later.save()

    with pytest.raises(Undone):
        rolled_back(body)

    assert list(Job.objects.values_list("pk", flat=True)) == [committed.pk]


def test_a_failed_prepare_leaves_the_block_transactional(alice: Persona) -> None:
    later = a_job(alice)

    def body() -> None:
        with pytest.raises(DatabaseError, match="no_such_table"):
            execute_together([Statement("SELECT * FROM no_such_table", name="test_unpreparable")])
        later.save()

    with pytest.raises(Undone):
        rolled_back(body)

    assert not Job.objects.filter(pk=later.pk).exists()


def test_a_pooled_connection_is_lent_with_the_configured_isolation_level() -> None:
    """A block that changed its connection's level and could not set it back
    (`chorus.snapshot`) does not pass it on."""
    connection.ensure_connection()
    connection.connection.isolation_level = IsolationLevel.SERIALIZABLE
    connection.close()  # back to the pool

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SHOW transaction_isolation")
        assert cursor.fetchone() == ("read committed",)


def test_a_submit_admits_its_job_in_two_round_trips(alice: Persona) -> None:
    """The tenant's lock with its reads, then the job row, its reservation and the
    commit: no BEGIN of its own between them (the API key and the rest of the
    request are looked up before, outside the transaction)."""
    alice.client.post("/v1/speech", {"text": "Hello."}, format="json")  # prepares

    with queries_sent() as sent:
        response = alice.client.post("/v1/speech", {"text": "Hello again."}, format="json")

    assert response.status_code == 202
    assert "BEGIN" not in sent, sent
    admission = [q for q in sent if "chorus_tenant_lock(" in q or "synthesis_job(" in q]
    assert len(admission) == 2, sent
    assert admission[0].startswith("BEGIN;\nEXECUTE chorus_tenant_lock(")
    assert admission[1].rstrip().endswith("COMMIT")
