"""A job's state changes each leave one log line from the service that made them."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from synthesis.engines.base import Engine
from synthesis.models import Job, JobStatus
from synthesis.services.execution import job_claim, job_execute
from tests.conftest import Persona


def job_lines(caplog: Any) -> list[dict[str, Any]]:
    return [vars(r) for r in caplog.records if r.name == "chorus.jobs"]


def submit(persona: Persona, **body: Any) -> str:
    response = persona.client.post("/v1/speech", {"text": "Hello.", **body}, format="json")
    assert response.status_code == 202, response.content
    return str(response.json()["id"])


@pytest.mark.django_db
def test_a_job_run_to_its_end_says_queued_running_succeeded(
    alice: Persona, engine: Engine, caplog: Any, django_capture_on_commit_callbacks: Any
) -> None:
    with caplog.at_level(logging.INFO), django_capture_on_commit_callbacks(execute=True):
        job_id = submit(alice)
        job_execute(job_id=job_id, engine=engine, worker="host:1")
    lines = [line for line in job_lines(caplog) if line["job_id"] == job_id]
    assert [line["status"] for line in lines] == ["queued", "running", "succeeded"]
    running = lines[1]
    assert (running["attempt"], running["worker"], running["tenant_id"]) == (
        1,
        "host:1",
        alice.tenant.pk,
    )
    assert lines[2]["total_s"] >= 0


@pytest.mark.django_db
def test_a_pending_job_let_into_the_broker_says_so(
    alice: Persona, settings: Any, caplog: Any, django_capture_on_commit_callbacks: Any
) -> None:
    settings.TENANT_BROKER_SLOTS = 1
    with caplog.at_level(logging.INFO), django_capture_on_commit_callbacks(execute=True):
        first = submit(alice)
        second = submit(alice)
    assert Job.objects.get(pk=second).status == JobStatus.PENDING
    with django_capture_on_commit_callbacks(execute=True):
        job_claim(job_id=first, worker="host:1")
    lines = [line for line in job_lines(caplog) if line["job_id"] == second]
    assert [(line["status"], line.get("reason")) for line in lines] == [
        ("pending", None),
        ("queued", "released"),
    ]


@pytest.mark.django_db
def test_a_cancelled_job_says_cancelled(alice: Persona, caplog: Any) -> None:
    with caplog.at_level(logging.INFO):
        job_id = submit(alice)
        assert alice.client.post(f"/v1/speech/{job_id}/cancel").status_code == 200
    lines = job_lines(caplog)
    assert [(line["status"], line["code"]) for line in lines] == [
        ("queued", ""),
        ("cancelled", "cancelled"),
    ]
