"""A job's timings: stamped by the database as the worker writes them, never
negative in the API, on both backends (SQLite's clock has milliseconds). Here
this process plays a worker whose clock runs ahead (Django's clock shifted);
`tests/e2e/test_worker_clock.py` runs a real worker process under libfaketime."""

from __future__ import annotations

import math
import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from chorus.db_clock import db_now
from synthesis.engines.base import Engine
from synthesis.models import Job
from synthesis.services.execution import job_execute
from tests.conftest import Persona

pytestmark = [pytest.mark.embedded, pytest.mark.django_db(transaction=True)]

SPANS = ("queue_wait_s", "first_audio_s", "total_s")
TOKEN = "timings-test-token"
AHEAD = timedelta(seconds=10)


@pytest.fixture(autouse=True)
def _synthetic_workers(settings: Any) -> None:
    settings.ENGINE = "synthetic"


def _submit(persona: Persona, text: str) -> dict[str, Any]:
    response = persona.client.post("/v1/speech", {"text": text}, format="json")
    assert response.status_code == 202, response.json()
    return dict(response.json())


def _timings(persona: Persona, job_id: str) -> dict[str, Any]:
    return dict(persona.client.get(f"/v1/speech/{job_id}").json()["timings"])


def _not_negative(value: float) -> bool:
    # -0.0 == 0 passes `>= 0`; its sign is what a client would read.
    return value >= 0 and math.copysign(1.0, value) > 0


def test_the_database_tells_its_time(db: None) -> None:
    assert abs(db_now() - timezone.now()) < timedelta(seconds=1)


def _queue_wait_sum(client: Any, priority: str) -> float:
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            wanted = sample.name == "chorus_job_queue_wait_seconds_sum"
            if wanted and sample.labels == {"priority": priority}:
                return float(sample.value)
    return 0.0


def test_a_workers_clock_ahead_shows_in_no_stamp_nor_the_queue_wait(
    alice: Persona, broker: Any, engine: Engine, client: Any, settings: Any, monkeypatch: Any
) -> None:
    settings.METRICS_TOKEN = TOKEN
    waited_before = _queue_wait_sum(client, "normal")
    # The wait runs from the submit's stamp, taken as its request starts, to
    # the claim: never longer than the real time from posting to the job's end
    # (a first request can take a second, all of it counted as waiting).
    posted = time.monotonic()
    job = _submit(alice, "Stamped by the database, in order.")
    real_now = timezone.now
    # This process's clock, as a worker host's whose clock runs 10 s ahead.
    monkeypatch.setattr(timezone, "now", lambda: real_now() + AHEAD)
    assert job_execute(job_id=job["id"], engine=engine, worker="test:1")["status"] == "succeeded"
    monkeypatch.undo()
    bound = time.monotonic() - posted + 1  # a wait longer than this came from the clock

    row = Job.objects.get(pk=job["id"])
    assert row.started_at
    assert row.first_audio_at
    assert row.finished_at
    assert row.created_at <= row.started_at <= row.first_audio_at <= row.finished_at
    assert row.finished_at < timezone.now()
    timings = _timings(alice, job["id"])
    assert all(_not_negative(timings[span]) for span in SPANS), timings
    assert timings["queue_wait_s"] < bound, timings
    assert timings["total_s"] < bound + 1, timings
    assert 0 <= _queue_wait_sum(client, "normal") - waited_before < bound


def test_a_reused_jobs_spans_are_zero_never_negative(
    alice: Persona, broker: Any, engine: Engine
) -> None:
    first = _submit(alice, "Said once, answered twice.")
    job_execute(job_id=first["id"], engine=engine, worker="test:1")
    reused = _submit(alice, "Said once, answered twice.")
    assert reused["status"] == "succeeded"

    timings = _timings(alice, reused["id"])
    assert {span: timings[span] for span in SPANS} == dict.fromkeys(SPANS, 0.0)
    assert all(_not_negative(timings[span]) for span in SPANS), timings
