"""What one submit costs the database: few round trips, the tenant lock once, and
the place in line only when the client asks for it (real PostgreSQL and Redis;
round trips as the wire shows them, `chorus.pg_trace`)."""

from __future__ import annotations

from typing import Any

import pytest

from chorus.pg_trace import queries_sent
from synthesis.models import Job, JobStatus
from tests.assertions import assert_error
from tests.conftest import Persona

pytestmark = pytest.mark.django_db(transaction=True)


def submit(persona: Persona, query: str = "") -> tuple[Any, list[str]]:
    """The answer, and each round trip to PostgreSQL it made (its statements'
    text, several to a string)."""
    with queries_sent() as sent:
        response = persona.client.post(f"/v1/speech{query}", {"text": "Hello."}, format="json")
    return response, sent


def tenant_locks(statements: list[str]) -> int:
    # Sent as a prepared statement (`chorus.statements`), several to a string.
    return sum(s.count("EXECUTE chorus_tenant_lock(") for s in statements)


def test_a_submit_that_goes_to_the_broker_makes_two_round_trips_then_waits_for_the_disk(
    alice: Persona, settings: Any
) -> None:
    settings.API_KEY_CACHE_S = 5  # as in production: the key is looked up once
    submit(alice)
    response, statements = submit(alice)

    assert response.status_code == 202
    assert response.json()["status"] == JobStatus.QUEUED
    # BEGIN with the tenant lock, the tenant's line, the locked period and the
    # reuse look; the job (published_at stamped here, not after the send) with its
    # ledger entry, the period's reservation and COMMIT (20 before, with the place
    # in line and a statement each; 4 with BEGIN and COMMIT on their own); once
    # published, the wait for the disk (`chorus.disk_wait`).
    assert len(statements) == 3, "\n".join(statements)
    assert statements[0].startswith("BEGIN;\nEXECUTE chorus_tenant_lock(")
    assert "EXECUTE chorus_reuse_probe(" in statements[0]
    assert statements[1].rstrip().endswith("COMMIT")
    assert "pg_logical_emit_message" in statements[2]
    assert tenant_locks(statements) == 1


def test_a_held_back_job_makes_as_many_round_trips_and_takes_the_lock_once(
    alice: Persona, settings: Any
) -> None:
    settings.API_KEY_CACHE_S = 5  # as in production: the key is looked up once
    settings.TENANT_BROKER_SLOTS = 1
    submit(alice)
    response, statements = submit(alice)

    assert response.json()["status"] == JobStatus.PENDING
    # As a queued one's, and no look after commit: a claim that frees the slot
    # meanwhile releases it (tests/synthesis/test_dispatch.py races the two).
    assert len(statements) == 3, "\n".join(statements)
    assert tenant_locks(statements) == 1
    assert list(Job.objects.values_list("status", flat=True).order_by("created_at")) == [
        JobStatus.QUEUED,
        JobStatus.PENDING,
    ]


def test_the_202_answer_leaves_the_place_in_line_out_unless_asked(alice: Persona) -> None:
    submit(alice)  # the tenant's first period and storage counter are opened here
    plain, statements = submit(alice)
    asked, asked_statements = submit(alice, "?queue=true")

    assert plain.json()["queue"] is None
    assert asked.json()["queue"]["position"] == 2
    assert len(asked_statements) > len(statements)
    polled = alice.client.get(plain["Location"]).json()
    assert polled["queue"]["position"] == 1


def test_the_queue_parameter_takes_true_or_false_only(alice: Persona) -> None:
    response, _ = submit(alice, "?queue=yes")

    error = assert_error(response, 400, "invalid_request")
    assert error["details"] == {"field": "queue", "value": "yes"}
    assert not Job.objects.exists()


def test_a_poll_of_a_held_back_job_makes_three_round_trips(
    alice: Persona, bob: Persona, settings: Any
) -> None:
    """The request clients make most: the job, then everything its place in
    line is computed from in one round trip (`synthesis.queue_reads`)."""
    settings.API_KEY_CACHE_S = 5  # as in production: the key is looked up once
    settings.TENANT_BROKER_SLOTS = 1
    for who in (alice, bob):
        submit(who)
    held_back = submit(alice)[0].json()
    assert held_back["status"] == JobStatus.PENDING
    alice.client.get(f"/v1/speech/{held_back['id']}")  # the key's last use is stamped here

    with queries_sent() as statements:
        response = alice.client.get(f"/v1/speech/{held_back['id']}")

    assert response.status_code == 200
    # Bob's queued job and Alice's own queued one start first.
    assert response.json()["queue"]["position"] == 2
    # The snapshot's BEGIN, with its isolation level, and the job; the line
    # (everything the place is computed from); COMMIT (9 before, with a query per
    # part of the line; 5 with BEGIN and the isolation level on their own).
    assert len(statements) == 3, "\n".join(statements)
    assert statements[0].startswith(
        "BEGIN ISOLATION LEVEL REPEATABLE READ;\nEXECUTE chorus_job_get("
    )
    assert statements[2] == "COMMIT"
