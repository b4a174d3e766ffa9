"""The embedded default (SQLite) when its one writer lock stays taken.

SQLite admits one writer at a time; the others wait up to the busy timeout
(20 s in settings). A request still waiting then answers 503 `service_busy`
with `Retry-After`, having done nothing, never a 500.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from synthesis.models import Job
from tests.assertions import assert_error
from tests.conftest import Persona

pytestmark = [pytest.mark.sqlite_only, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def write_lock_held_elsewhere(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Another connection (as the worker or the sweeper would) holds the write
    lock; this process waits at most 0.2 s for it."""
    assert connection.vendor == "sqlite", "runs in the embedded pass (make test-sqlite)"
    holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    connection.close()
    monkeypatch.setitem(connection.settings_dict["OPTIONS"], "timeout", 0.2)
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        connection.close()  # the next connection waits the configured 20 s again


def test_a_submit_that_cannot_get_the_write_lock_answers_503_and_does_nothing(
    alice: Persona, broker: Any, request: pytest.FixtureRequest
) -> None:
    assert alice.client.get("/v1/usage").status_code == 200  # the key's last use is stamped
    request.getfixturevalue("write_lock_held_elsewhere")

    response = alice.client.post("/v1/speech", {"text": "Hello there."}, format="json")
    reads_go_on = alice.client.get("/v1/usage")  # WAL: readers never wait for the writer

    assert_error(response, 503, "service_busy")
    assert response["Retry-After"] == "1"
    assert reads_go_on.status_code == 200
    assert reads_go_on.json()["characters"]["reserved"] == 0
    assert not Job.objects.exists()
    assert broker.llen("synth.normal") == 0
