"""What one submit costs the database: few statements, the tenant lock once, and
the place in line only when the client asks for it (real PostgreSQL and Redis)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from synthesis.models import Job, JobStatus
from tests.assertions import assert_error
from tests.conftest import Persona

pytestmark = pytest.mark.django_db(transaction=True)


def submit(persona: Persona, query: str = "") -> tuple[Any, list[str]]:
    with CaptureQueriesContext(connection) as queries:
        response = persona.client.post(f"/v1/speech{query}", {"text": "Hello."}, format="json")
    return response, [q["sql"] for q in queries.captured_queries]


def tenant_locks(statements: list[str]) -> int:
    # Sent as a prepared statement (`chorus.statements`), several to a string.
    return sum(s.count("EXECUTE chorus_tenant_lock(") for s in statements)


def test_a_submit_that_goes_to_the_broker_makes_four_round_trips_at_most(
    alice: Persona, settings: Any
) -> None:
    settings.API_KEY_CACHE_S = 5  # as in production: the key is looked up once
    submit(alice)
    response, statements = submit(alice)

    assert response.status_code == 202
    assert response.json()["status"] == JobStatus.QUEUED
    # BEGIN; the tenant lock with the tenant's line, the locked period and the
    # reuse look; the job (published_at stamped here, not after the send) with its
    # ledger entry and the period's reservation; COMMIT (20 before, with the place
    # in line and a statement each).
    assert len(statements) <= 4, "\n".join(statements)
    assert "EXECUTE chorus_reuse_probe(" in statements[1]
    assert tenant_locks(statements) == 1


def test_a_held_back_job_makes_four_round_trips_and_takes_the_lock_once(
    alice: Persona, settings: Any
) -> None:
    settings.API_KEY_CACHE_S = 5  # as in production: the key is looked up once
    settings.TENANT_BROKER_SLOTS = 1
    submit(alice)
    response, statements = submit(alice)

    assert response.json()["status"] == JobStatus.PENDING
    # As a queued one's, and no look after commit: a claim that frees the slot
    # meanwhile releases it (tests/synthesis/test_dispatch.py races the two).
    assert len(statements) <= 4, "\n".join(statements)
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


def test_a_poll_of_a_held_back_job_makes_five_round_trips_at_most(
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

    with CaptureQueriesContext(connection) as queries:
        response = alice.client.get(f"/v1/speech/{held_back['id']}")

    assert response.status_code == 200
    # Bob's queued job and Alice's own queued one start first.
    assert response.json()["queue"]["position"] == 2
    statements = [q["sql"] for q in queries.captured_queries]
    # BEGIN and the snapshot's isolation level; the job; the line (everything the
    # place is computed from); COMMIT (9 before, with a query per part of the line).
    assert len(statements) <= 5, "\n".join(statements)
