"""A submit's job is visible and published before its commit reaches the disk,
and answered only after (`chorus.disk_wait`; real PostgreSQL and Redis)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from django.db import connection, transaction

from chorus.disk_wait import commit_unflushed, wait_for_disk
from chorus.pg_trace import queries_sent
from chorus.statements import execute_together
from synthesis.models import Job
from synthesis.services import jobs
from tests.assertions import assert_error
from tests.conftest import Persona

pytestmark = pytest.mark.django_db(transaction=True)

WAIT = "SELECT pg_logical_emit_message(true, 'chorus.disk_wait', '')"


def one_value(sql: str) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchone()[0]


def wait_cut_short() -> None:
    """A wait for the disk that the database fails: a statement timeout, a real
    error from a real server."""
    with connection.cursor() as cursor:
        cursor.execute("SET statement_timeout = 1")
        try:
            cursor.execute("SELECT pg_sleep(0.5)")
        finally:
            cursor.execute("RESET statement_timeout")


@pytest.fixture
def at_the_wait(monkeypatch: pytest.MonkeyPatch, broker: redis.Redis) -> list[dict[str, Any]]:
    """What was true when a submit began to wait for the disk: its job's message
    in the broker, its row committed."""
    seen: list[dict[str, Any]] = []

    def look_then_wait() -> None:
        seen.append(
            {
                "messages": broker.llen("synth.normal"),
                "rows": Job.objects.count(),  # this connection, autocommit: committed rows
                "in_transaction": connection.in_atomic_block,
            }
        )
        wait_for_disk()

    monkeypatch.setattr(jobs, "wait_for_disk", look_then_wait)
    return seen


def test_a_submit_is_published_before_it_waits_for_the_disk_and_answered_after(
    alice: Persona, at_the_wait: list[dict[str, Any]]
) -> None:
    alice.client.post("/v1/speech", {"text": "Hello."}, format="json")  # prepares

    with queries_sent() as sent:
        response = alice.client.post("/v1/speech", {"text": "Hello again."}, format="json")

    assert response.status_code == 202
    assert at_the_wait[-1] == {"messages": 2, "rows": 2, "in_transaction": False}
    admission = [q for q in sent if "chorus_insert_synthesis_job(" in q]
    assert admission[0].rstrip().endswith("SET LOCAL synchronous_commit TO OFF;\nCOMMIT")
    assert sent[-1] == WAIT  # the last thing before the answer


def test_a_submit_with_an_idempotency_key_waits_for_the_disk_too(
    alice: Persona, at_the_wait: list[dict[str, Any]]
) -> None:
    headers = {"HTTP_IDEMPOTENCY_KEY": "one-request"}
    with queries_sent() as sent:
        response = alice.client.post("/v1/speech", {"text": "Hi."}, format="json", **headers)

    assert response.status_code == 202
    assert at_the_wait == [{"messages": 1, "rows": 1, "in_transaction": False}]
    assert any("SET LOCAL synchronous_commit TO OFF" in q for q in sent)
    assert sent[-1] == WAIT
    assert "COMMIT" in sent[:-1]


def test_a_repeated_idempotency_key_is_answered_once_its_job_is_on_disk(
    alice: Persona, broker: redis.Redis
) -> None:
    headers = {"HTTP_IDEMPOTENCY_KEY": "same-request"}
    first = alice.client.post("/v1/speech", {"text": "Hi."}, format="json", **headers)

    with queries_sent() as sent:
        again = alice.client.post("/v1/speech", {"text": "Hi."}, format="json", **headers)

    assert again.json()["id"] == first.json()["id"]
    assert sent[-1] == WAIT


def test_a_failed_wait_for_the_disk_says_the_job_is_unconfirmed(
    alice: Persona, broker: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database fails after the commit (here a statement timeout on the
    wait itself): the job stands and was published, and the client is told to
    look it up rather than submit again."""

    monkeypatch.setattr(jobs, "wait_for_disk", wait_cut_short)

    response = alice.client.post("/v1/speech", {"text": "Hello."}, format="json")

    error = assert_error(response, 503, "job_unconfirmed")
    job = Job.objects.get()
    assert error["details"] == {"job_id": str(job.pk)}
    assert str(job.pk) in error["message"]
    assert response["Retry-After"] == "5"
    assert broker.llen("synth.normal") == 1  # it was published: it will run


def test_a_refused_submit_neither_commits_nor_waits(
    alice: Persona, at_the_wait: list[dict[str, Any]]
) -> None:
    response = alice.client.post("/v1/speech", {"text": "x" * 100_000}, format="json")

    assert response.status_code in (400, 413, 422)
    assert at_the_wait == []
    assert not Job.objects.exists()


def test_only_the_transaction_django_commits_at_the_blocks_end_goes_unflushed() -> None:
    with transaction.atomic():
        with transaction.atomic():  # an inner block's commit is its owner's
            assert commit_unflushed() == []
        outermost = commit_unflushed()
    assert [s.sql for s in outermost] == ["SET LOCAL synchronous_commit TO OFF"]
    assert commit_unflushed() == []  # outside any block: nothing to commit


def test_after_the_wait_an_unflushed_commit_is_on_disk() -> None:
    """Checked on the log's positions: the commit's record is before the flushed
    end. (The server's log writer flushes an unflushed commit on its own within
    a few hundred ms; a wait that flushed nothing fails this at once.)"""
    flushed = []
    for _ in range(20):
        with transaction.atomic():
            execute_together(commit_unflushed())
            Job.objects.filter(pk=None).update(text="")  # no rows: not a write
            one_value("SELECT pg_logical_emit_message(true, 'test', 'a write')")
        committed_to = one_value("SELECT pg_current_wal_insert_lsn()::text")

        wait_for_disk()

        flushed.append(one_value(f"SELECT pg_current_wal_flush_lsn() >= '{committed_to}'"))
    assert flushed == [True] * 20
