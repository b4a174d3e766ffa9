"""The sweeper's pass repairs what a lost step left behind: a batch whose last
settlement never ran, an archive whose task was lost, and archives past retention."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from batches import archive, sweeper
from batches.archive import batch_archive_build
from batches.models import ArchiveStatus, Batch, BatchStatus
from batches.receivers import _settle_batch_of
from quotas.counters import storage_recount, storage_used
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


def test_an_archive_counts_in_the_tenants_storage_once_until_it_expires(
    alice: Persona, broker: Any, light_queue: Any, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = submit(alice, [{"text": "One."}, {"text": "Two."}]).json()
    run_jobs(engine, waiting_jobs(body["id"]))
    tenant_id = alice.tenant.pk
    before = storage_used(tenant_id=tenant_id)
    write = archive._write
    deliveries: list[str] = []

    def write_while_a_second_delivery_builds(**kw: Any) -> int:
        # The task delivered twice: the second builds it whole meanwhile.
        if not deliveries:
            deliveries.append("second")
            deliveries.append(batch_archive_build(batch_id=body["id"]))
        return write(**kw)

    monkeypatch.setattr(archive, "_write", write_while_a_second_delivery_builds)

    assert batch_archive_build(batch_id=body["id"]) == "ready"

    assert deliveries == ["second", "ready"]
    size = Batch.objects.get(pk=body["id"]).archive_bytes
    assert size is not None
    assert size > 0
    assert (
        storage_used(tenant_id=tenant_id) == before + size == storage_recount(tenant_id=tenant_id)
    )

    Batch.objects.filter(pk=body["id"]).update(finished_at=timezone.now() - timedelta(days=8))
    sweep()

    assert Batch.objects.get(pk=body["id"]).archive_status == ArchiveStatus.EXPIRED
    assert storage_used(tenant_id=tenant_id) == before == storage_recount(tenant_id=tenant_id)


def _ready_archive(persona: Persona, *, days_ago: int, size: int = 100) -> Batch:
    batch = Batch.objects.create(
        tenant=persona.tenant,
        item_count=1,
        characters=4,
        status=BatchStatus.COMPLETED,
        archive_status=ArchiveStatus.READY,
        archive_bytes=size,
        finished_at=timezone.now() - timedelta(days=days_ago),
    )
    batch.archive_key = f"batches/{batch.pk}.zip"
    batch.save(update_fields=["archive_key"])
    get_storage().put(
        bucket=persona.tenant.bucket, key=batch.archive_key, data=b"z" * size, content_type="x"
    )
    return batch


def test_archives_kept_longer_never_hold_back_those_that_are_due(
    alice: Persona, bob: Persona, broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More archives kept for a year than one pass expires, all older than
    another tenant's due archive: that one still goes in the next pass."""
    monkeypatch.setattr(sweeper, "SWEEP_BATCH", 2)
    alice.tenant.limit_overrides = {"output_retention_days": 365}
    alice.tenant.save()
    kept = [_ready_archive(alice, days_ago=60 + n) for n in range(3)]
    due = _ready_archive(bob, days_ago=8)  # bob's plan keeps audio 7 days

    sweep()

    assert Batch.objects.get(pk=due.pk).archive_status == ArchiveStatus.EXPIRED
    assert not get_storage().exists(bucket=bob.tenant.bucket, key=due.archive_key)
    assert all(Batch.objects.get(pk=b.pk).archive_status == ArchiveStatus.READY for b in kept)
