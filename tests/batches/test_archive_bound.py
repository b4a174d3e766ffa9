"""A tenant has at most CHORUS_BATCH_ARCHIVE_TENANT_CONCURRENCY archive builds
running: one that ends many big batches at once holds that many light-worker
threads, not all of them (which split and join long texts too). A build over the
bound is deferred, never failed: its batch stays `waiting`, and the next of the
tenant's builds to end publishes it. Real PostgreSQL, Redis and storage; a build
"runs at once" with another by starting inside it, as a second light-worker
thread would."""

from __future__ import annotations

import json
from typing import Any

import pytest

from batches import archive
from batches.archive import batch_archive_build
from batches.models import ArchiveStatus, Batch
from synthesis.engines.base import Engine
from tests.batches.conftest import run_jobs, submit, waiting_jobs
from tests.conftest import Persona

pytestmark = pytest.mark.django_db(transaction=True)


def ended_batch(persona: Persona, engine: Engine, text: str) -> str:
    body = submit(persona, [{"text": text}]).json()
    run_jobs(engine, waiting_jobs(body["id"]))
    return str(body["id"])


def archive_status(batch_id: str) -> str:
    return str(Batch.objects.get(pk=batch_id).archive_status)


def test_a_tenants_archive_over_its_bound_waits_for_its_running_build_then_is_built(
    alice: Persona,
    bob: Persona,
    broker: Any,
    light_queue: Any,
    engine: Engine,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings.BATCH_ARCHIVE_TENANT_CONCURRENCY = 1
    first = ended_batch(alice, engine, "Alice's first batch.")
    second = ended_batch(alice, engine, "Alice's second batch.")
    bobs = ended_batch(bob, engine, "Bob's batch.")
    light_queue.delete("light")  # the messages of the batches' endings: run by hand here
    write = archive._write
    during: dict[str, str] = {}

    def others_start_meanwhile(**kwargs: Any) -> int:
        if not during:
            during["alice"] = batch_archive_build(batch_id=second)
            during["alice, status"] = archive_status(second)
            during["bob"] = batch_archive_build(batch_id=bobs)
        return write(**kwargs)

    monkeypatch.setattr(archive, "_write", others_start_meanwhile)

    assert batch_archive_build(batch_id=first) == "ready"

    # Alice's second build waited, without failing; Bob's did not wait for Alice's.
    assert during == {"alice": "deferred", "alice, status": "waiting", "bob": "ready"}
    # Alice's build that ended handed her waiting one to a light worker.
    [message] = [json.loads(raw) for raw in light_queue.lrange("light", 0, -1)]
    assert message["headers"]["task"] == "batches.build_archive"
    assert message["headers"]["argsrepr"] == repr((second,))
    assert batch_archive_build(batch_id=second) == "ready"
    assert archive_status(second) == ArchiveStatus.READY


def test_an_archive_built_again_while_it_builds_counts_its_own_build_once(
    alice: Persona, broker: Any, light_queue: Any, engine: Engine, settings: Any
) -> None:
    """Two builds of one tenant may run: a redelivered task still rebuilds its own
    archive (as before), and a third waits."""
    settings.BATCH_ARCHIVE_TENANT_CONCURRENCY = 2
    first = ended_batch(alice, engine, "One.")
    second = ended_batch(alice, engine, "Two.")
    Batch.objects.filter(pk__in=[first, second]).update(archive_status=ArchiveStatus.BUILDING)
    third = ended_batch(alice, engine, "Three.")

    assert batch_archive_build(batch_id=third) == "deferred"
    assert archive_status(third) == ArchiveStatus.WAITING
    Batch.objects.filter(pk=second).update(archive_status=ArchiveStatus.READY)
    assert batch_archive_build(batch_id=first) == "ready"  # its own build counted once
    assert batch_archive_build(batch_id=third) == "ready"
