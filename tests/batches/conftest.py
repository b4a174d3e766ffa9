"""Batches run their items as real jobs: submitted through the API into real
PostgreSQL and Redis, then executed in this process with the synthetic engine
(`job_execute`, what a worker runs). Transactions commit for real: a batch ends
in an on-commit step, as in production."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings as django_settings

from batches.models import Batch
from batches.signals import batch_completed
from synthesis.engines.base import Engine
from synthesis.models import Job, JobStatus
from synthesis.services.execution import job_execute
from tests.conftest import Persona


@pytest.fixture
def light_queue(broker: redis.Redis) -> Iterator[redis.Redis]:
    broker.delete("light")
    yield broker
    broker.delete("light")


@pytest.fixture
def completions() -> Iterator[list[tuple[Any, str]]]:
    """Every batch_completed signal sent while the test runs."""
    seen: list[tuple[Any, str]] = []

    def record(*, batch: Batch, status: str, **kwargs: Any) -> None:
        seen.append((batch.pk, status))

    batch_completed.connect(record, dispatch_uid="test-record")
    yield seen
    batch_completed.disconnect(dispatch_uid="test-record")


def submit(persona: Persona, items: list[dict[str, Any]], **body: Any) -> Any:
    return persona.client.post("/v1/batches", {"items": items, **body}, format="json")


def run_jobs(engine: Engine, jobs: Any) -> None:
    """What a worker does with each job (in order)."""
    for job in jobs:
        job_execute(job_id=job.pk, engine=engine, worker="test-worker", epoch=job.epoch)


def waiting_jobs(batch_id: Any) -> list[Job]:
    return list(
        Job.objects.filter(
            batch_item__batch_id=batch_id, status__in=(JobStatus.QUEUED, JobStatus.PENDING)
        ).order_by("batch_item__index")
    )


@pytest.fixture(autouse=True)
def _items_reach_the_broker(settings: Any) -> None:
    """These tests run a batch's items themselves, in their own order
    (`run_jobs`), so every item must be queued, not held back by fair admission
    (the production default of two per tenant); the tests of held-back items set
    the default again."""
    settings.TENANT_BROKER_SLOTS = 1_000


@pytest.fixture(autouse=True)
def _fresh_runs(settings: Any) -> None:
    # Reuse is tested on its own (tests/synthesis/test_reuse.py); batches here run
    # every item so each one's path is the worker's.
    settings.RESULT_REUSE = False
    assert django_settings.REDIS_URL
