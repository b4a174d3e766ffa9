"""The sweeper's pass repairs what a lost step left behind: a batch whose last
settlement never ran, an archive whose task was lost, and archives past retention."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from batches.archive import batch_archive_build
from batches.models import ArchiveStatus, Batch, BatchStatus
from batches.receivers import _settle_batch_of
from synthesis.engines.base import Engine
from synthesis.services.sweeper import sweep
from synthesis.signals import job_finished
from synthesis.storage_runtime import get_storage
from tests.batches.conftest import run_jobs, submit, waiting_jobs
from tests.conftest import Persona

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_batch_whose_last_settlement_was_lost_is_ended_by_the_sweeper(
    alice: Persona, broker: Any, light_queue: Any, engine: Engine, completions: list[Any]
) -> None:
    body = submit(alice, [{"text": "One."}, {"text": "Two."}]).json()
    # As if the process died between committing each job and settling its batch.
    job_finished.disconnect(_settle_batch_of)
    try:
        run_jobs(engine, waiting_jobs(body["id"]))
    finally:
        job_finished.connect(_settle_batch_of)
    assert Batch.objects.get(pk=body["id"]).status == BatchStatus.RUNNING

    sweep()
    sweep()

    assert Batch.objects.get(pk=body["id"]).status == BatchStatus.COMPLETED
    assert len(completions) == 1
    assert light_queue.llen("light") == 1


def test_an_archive_whose_task_was_lost_is_queued_again(
    alice: Persona, broker: Any, light_queue: Any, engine: Engine
) -> None:
    body = submit(alice, [{"text": "One."}]).json()
    run_jobs(engine, waiting_jobs(body["id"]))
    light_queue.delete("light")  # the message was lost
    Batch.objects.filter(pk=body["id"]).update(finished_at=timezone.now() - timedelta(minutes=6))

    sweep()

    assert light_queue.llen("light") == 1


def test_an_archive_past_the_plans_retention_is_deleted(
    alice: Persona, broker: Any, light_queue: Any, engine: Engine
) -> None:
    body = submit(alice, [{"text": "One."}]).json()
    run_jobs(engine, waiting_jobs(body["id"]))
    assert batch_archive_build(batch_id=body["id"]) == "ready"
    batch = Batch.objects.select_related("tenant").get(pk=body["id"])
    sweep()
    assert Batch.objects.get(pk=body["id"]).archive_status == ArchiveStatus.READY

    Batch.objects.filter(pk=batch.pk).update(finished_at=timezone.now() - timedelta(days=8))
    sweep()

    assert Batch.objects.get(pk=body["id"]).archive_status == ArchiveStatus.EXPIRED
    assert not get_storage().exists(bucket=batch.tenant.bucket, key=batch.archive_key)
    assert alice.client.get(f"/v1/batches/{body['id']}").json()["archive"]["url"] is None
