"""Reads that must agree (`chorus.snapshot`): one REPEATABLE READ transaction on
real PostgreSQL, whose level travels in its BEGIN and goes no further."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.db import connection, transaction

from chorus.pg_trace import queries_sent
from chorus.snapshot import one_snapshot
from chorus.statements import Statement, execute_together
from synthesis.models import Job, JobStatus
from tests.conftest import Persona

pytestmark = pytest.mark.django_db(transaction=True)


def count_by_orm() -> int:
    return Job.objects.count()


def count_together() -> int:
    [rows] = execute_together([Statement(f"SELECT count(*) FROM {Job._meta.db_table}")])
    assert rows is not None
    return int(rows[0][0])


def commit_a_job_elsewhere(persona: Persona) -> None:
    def add() -> None:
        try:
            Job.objects.create(tenant=persona.tenant, text="Hi.", characters=3)
        finally:
            connection.close()

    writer = threading.Thread(target=add)
    writer.start()
    writer.join(10)


def failed_snapshot() -> None:
    with one_snapshot():
        count_together()
        raise ZeroDivisionError


def isolation_now() -> str:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SHOW transaction_isolation")
        return str(cursor.fetchone()[0])


@pytest.mark.parametrize("first_read", [count_by_orm, count_together], ids=["orm", "together"])
def test_every_read_of_a_snapshot_sees_the_state_of_its_first(
    alice: Persona, first_read: Callable[[], int]
) -> None:
    with queries_sent() as sent, one_snapshot():
        before = first_read()
        commit_a_job_elsewhere(alice)  # committed between the two reads
        again = count_together()

    assert (before, again) == (0, 0)
    assert Job.objects.filter(status=JobStatus.QUEUED).count() == 1  # it was committed
    assert sent[0].startswith("BEGIN ISOLATION LEVEL REPEATABLE READ")
    assert not any(query.startswith("SET TRANSACTION") for query in sent)


def test_the_connection_keeps_its_own_isolation_level_after_a_snapshot(alice: Persona) -> None:
    with one_snapshot():
        count_together()
    assert isolation_now() == "read committed"

    with pytest.raises(ZeroDivisionError):
        failed_snapshot()
    assert connection.connection.isolation_level is None
    assert isolation_now() == "read committed"
