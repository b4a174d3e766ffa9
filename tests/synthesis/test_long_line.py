"""A long waiting line: each tenant's share of it is counted once a moment per
web process, not on every poll (`synthesis.queue_reads`)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from synthesis import queue_reads
from synthesis.models import Job, JobStatus
from tests.conftest import Persona

pytestmark = pytest.mark.django_db(transaction=True)

SHARES = "EXECUTE chorus_line_waiting"  # the shares, a prepared statement


@pytest.fixture(autouse=True)
def nothing_kept(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    monkeypatch.setattr(queue_reads, "_kept", None)  # and put back after
    settings.TENANT_BROKER_SLOTS = 1
    settings.API_KEY_CACHE_S = 5  # as in production: the key is looked up once


def submit(persona: Persona) -> dict[str, Any]:
    response = persona.client.post("/v1/speech", {"text": "Hello."}, format="json")
    assert response.status_code == 202, response.content
    return dict(response.json())


def poll(persona: Persona, job_id: str) -> tuple[int, list[str]]:
    with CaptureQueriesContext(connection) as queries:
        response = persona.client.get(f"/v1/speech/{job_id}")
    assert response.status_code == 200, response.content
    return response.json()["queue"]["position"], [q["sql"] for q in queries.captured_queries]


def counted_shares(statements: list[str]) -> bool:
    return any(SHARES in s for s in statements)


def line_of_three(alice: Persona, bob: Persona) -> str:
    """Bob's job and Alice's first in the broker, Alice's second held back and
    polled once (place 2); then Bob's job starts. Returns the held-back job."""
    submit(bob)
    submit(alice)
    held_back = str(submit(alice)["id"])
    first, statements = poll(alice, held_back)
    assert first == 2
    assert counted_shares(statements)
    Job.objects.filter(tenant=bob.tenant).update(status=JobStatus.RUNNING)
    return held_back


def test_a_short_line_is_counted_on_every_poll(alice: Persona, bob: Persona) -> None:
    held_back = line_of_three(alice, bob)

    second, statements = poll(alice, held_back)
    assert counted_shares(statements)
    assert second == 1  # at once: nothing was kept


def test_a_long_lines_shares_are_reused_for_a_moment(
    alice: Persona, bob: Persona, settings: Any
) -> None:
    settings.LONG_LINE_JOBS = 3  # "long" from three waiting jobs
    settings.LONG_LINE_REUSE_S = 60
    held_back = line_of_three(alice, bob)

    again, statements = poll(alice, held_back)
    assert not counted_shares(statements)
    assert again == 2  # the shape read a moment ago
    assert len(statements) <= 5  # still one round trip for the rest of the line

    settings.LONG_LINE_REUSE_S = 0  # the moment is over
    later, statements = poll(alice, held_back)
    assert counted_shares(statements)
    assert later == 1
    # Now two waiting jobs: short again, so the next poll counts again too.
    settings.LONG_LINE_REUSE_S = 60
    assert counted_shares(poll(alice, held_back)[1])


def test_a_job_released_since_the_shape_was_read_has_a_place(
    alice: Persona, bob: Persona, settings: Any
) -> None:
    """A job queued after the kept shape was read is not in that shape's broker
    order: it stands behind its tenant's queued jobs, on a poll and on a page."""
    settings.LONG_LINE_JOBS = 3
    settings.LONG_LINE_REUSE_S = 60
    submit(bob)
    submit(alice)
    held_back = submit(alice)["id"]
    still_pending = submit(alice)["id"]  # so the page holds a run of pending jobs too
    assert poll(alice, held_back)[0] == 2  # the shape is kept from here
    Job.objects.filter(pk=held_back).update(status=JobStatus.QUEUED)  # released

    position, statements = poll(alice, held_back)
    page = alice.client.get("/v1/speech")

    assert not counted_shares(statements)
    assert position == 2  # behind alice's queued job and bob's, as before its release
    assert page.status_code == 200, page.content
    places = {row["id"]: row["queue"]["position"] for row in page.json()["results"]}
    assert places[held_back] == 2
    # The kept shape does not know the release yet: one place short, for a moment.
    assert places[still_pending] == 2
    settings.LONG_LINE_REUSE_S = 0
    assert poll(alice, still_pending)[0] == 3
