"""A running job looks whether it still owns the job every OWNERSHIP_CHECK_S,
not at every chunk (real PostgreSQL; the synthetic engine's chunks, paced here)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from synthesis.engines.base import Engine, PreparedVoice, Samples
from synthesis.models import Job, JobStatus
from synthesis.services.execution import OWNERSHIP_CHECK_S, job_execute
from synthesis.services.jobs import job_cancel
from tests.conftest import Persona
from tests.synthesis.test_execution import ScriptedEngine, make_job

pytestmark = pytest.mark.django_db(transaction=True)

CHUNK = np.full(2400, 0.1, dtype=np.float32)


class PacedEngine(ScriptedEngine):
    """Yields `count` chunks, `pause` seconds apart, calling `on_chunk(i)` before each."""

    def __init__(
        self, inner: Engine, *, count: int, pause: float, on_chunk: Callable[[int], None]
    ) -> None:
        super().__init__(inner)
        self.count, self.pause, self.on_chunk = count, pause, on_chunk
        self.yielded = 0

    def synthesize(
        self, *, text: str, voice: PreparedVoice | None, speed: float = 1.0, instruction: str = ""
    ) -> Iterator[Samples]:
        for i in range(self.count):
            self.on_chunk(i)
            time.sleep(self.pause)
            self.yielded += 1
            yield CHUNK


def ownership_checks(statements: list[str]) -> int:
    return sum(1 for s in statements if s.startswith('SELECT 1 AS "a" FROM "synthesis_job"'))


def test_chunks_that_come_quickly_are_not_checked_one_by_one(
    alice: Persona, engine: Engine
) -> None:
    job = make_job(alice)
    paced = PacedEngine(engine, count=8, pause=0.0, on_chunk=lambda i: None)

    with CaptureQueriesContext(connection) as queries:
        result = job_execute(job_id=job.pk, engine=paced, worker="w1")

    assert result["status"] == "succeeded"
    assert ownership_checks([q["sql"] for q in queries.captured_queries]) == 0
    job.refresh_from_db()
    assert job.duration_s == pytest.approx(8 * len(CHUNK) / paced.sample_rate, abs=0.01)


def test_a_cancelled_job_stops_within_the_check_interval(alice: Persona, engine: Engine) -> None:
    job = make_job(alice)
    pause = 0.05

    def cancel_at_third(i: int) -> None:
        if i == 2:
            job_cancel(tenant=alice.tenant, job=Job.objects.get(pk=job.pk))

    paced = PacedEngine(engine, count=40, pause=pause, on_chunk=cancel_at_third)

    result = job_execute(job_id=job.pk, engine=paced, worker="w1")

    assert result["status"] == "cancelled"
    assert Job.objects.get(pk=job.pk).status == JobStatus.CANCELLED
    # Cancelled before chunk 3; seen at the first boundary past the interval.
    assert paced.yielded <= 3 + OWNERSHIP_CHECK_S / pause + 1


def test_a_jobs_run_uses_prepared_statements_with_generic_plans(
    alice: Persona, engine: Engine, settings: Any
) -> None:
    """The claim, the release of the tenant's next job and the settlement are
    planned once per worker connection (`chorus.statements`), not once a job."""
    settings.TENANT_BROKER_SLOTS = 1  # each claim releases the tenant's next job
    settings.RESULT_REUSE = False  # the same text runs again
    jobs = [make_job(alice) for _ in range(8)]
    for job in jobs:
        Job.objects.filter(pk=job.pk).update(status=JobStatus.QUEUED)
        epoch = Job.objects.get(pk=job.pk).epoch
        assert job_execute(job_id=job.pk, engine=engine, worker="w1", epoch=epoch)["status"] == (
            "succeeded"
        )

    with connection.cursor() as cursor:
        cursor.execute("SELECT name, generic_plans FROM pg_prepared_statements")
        generic = dict(cursor.fetchall())
    for name in ("job_claim_epoch", "ledger_reservation", "ledger_settle", "jobs_release"):
        assert generic.get(f"chorus_{name}", 0) >= 1, (name, generic)
