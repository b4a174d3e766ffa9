"""Statements sent together (`chorus.statements`): one round trip on PostgreSQL,
with each statement's own snapshot, rows and errors as separate executes give
(real PostgreSQL; the ones marked `embedded` on SQLite too)."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext

from chorus.statements import (
    Statement,
    execute_together,
    insert_statement,
    inserted,
    model_from_row,
)
from quotas.models import UsagePeriod
from quotas.services import usage_period_current
from synthesis.line_counts import line_from_rows, line_statement
from synthesis.models import Job, JobStatus
from tenants.locks import tenant_lock, tenant_lock_then
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
    assert len(queries.captured_queries) == sent
    read = Job.objects.get(pk=job.pk)
    for column in Job._meta.concrete_fields:  # auto_now_add's created_at included
        assert getattr(read, column.attname) == getattr(job, column.attname), column.name
    assert job.created_at is not None
    assert not job._state.adding


@pytest.mark.embedded
def test_a_failing_statement_raises_and_the_transaction_keeps_nothing(alice: Persona) -> None:
    job = a_job(alice)
    with pytest.raises(DatabaseError), transaction.atomic():
        execute_together([insert_statement(job), Statement("SELECT * FROM no_such_table")])

    assert not Job.objects.filter(pk=job.pk).exists()


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
            alice.tenant.pk, [line_statement(tenant_id=alice.tenant.pk, priority="normal")]
        )
    waited = time.monotonic() - started
    assert done.wait(10)

    assert waited > 0.3  # it did wait for the holder
    in_flight, pending, queued = line_from_rows(rows)
    assert (in_flight, pending, queued) == (1, 0, 1)


def test_statements_go_as_one_round_trip_on_postgresql(alice: Persona) -> None:
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        results = tenant_lock_then(
            alice.tenant.pk,
            [line_statement(tenant_id=alice.tenant.pk, priority="normal"), Statement("SELECT 2")],
        )

    assert results == [[(0, 0, 0)], [(2,)]]
    sent = [q["sql"] for q in queries.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]
    assert len(sent) == 1, sent
