"""Cancelling a batch: answered at once with its queued and running items
stopped and refunded, the pending rest cancelled set-based in chunks and the
batch ended by a light worker or the sweeper; resumable; and no item of a
cancelled batch ever starts or is charged."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from batches import cancelling
from batches.cancelling import batch_cancel_finish
from batches.models import Batch, BatchItem, BatchStatus
from quotas.counters import counters_reconcile
from quotas.models import LedgerEntry, UsagePeriod
from synthesis.engines.base import Engine, PreparedVoice, Samples
from synthesis.models import Job, JobStatus
from synthesis.services.dispatch import admission_refill
from synthesis.services.execution import job_claim, job_execute
from synthesis.services.sweeper import sweep
from tests.batches.conftest import run_jobs, submit, waiting_jobs
from tests.conftest import Persona

pytestmark = [pytest.mark.embedded, pytest.mark.django_db(transaction=True)]


def _items(n: int) -> list[dict[str, Any]]:
    return [{"text": f"Item number {i}."} for i in range(n)]


def _jobs(batch_id: Any) -> list[Job]:
    return list(Job.objects.filter(batch_item__batch_id=batch_id).order_by("batch_item__index"))


def _ledger(job: Job) -> list[tuple[str, int]]:
    return sorted(LedgerEntry.objects.filter(job=job).values_list("kind", "characters"))


def _assert_refunded_once(jobs: list[Job]) -> None:
    """Each cancelled item: one reservation and one refund, nothing charged."""
    for job in jobs:
        job.refresh_from_db()
        assert job.status == JobStatus.CANCELLED
        assert _ledger(job) == [("refund", job.characters), ("reserve", job.characters)]


class CancelledMidway:
    """Yields one chunk, lets `between` run (the tenant cancels), then another."""

    def __init__(self, inner: Engine, between: Callable[[], None]) -> None:
        self.name = inner.name
        self.sample_rate = inner.sample_rate
        self.between = between

    def synthesize(
        self,
        *,
        text: str,
        voice: PreparedVoice | None,
        speed: float = 1.0,
        instruction: str = "",
    ) -> Iterator[Samples]:
        yield np.full(2400, 0.1, dtype=np.float32)
        self.between()
        yield np.full(2400, 0.1, dtype=np.float32)


def test_a_cancel_answers_at_once_with_every_unfinished_item_stopped_and_refunded(
    alice: Persona, broker: Any, light_queue: Any, engine: Engine, completions: list[Any]
) -> None:
    body = submit(alice, _items(5)).json()
    done, running, *waiting = _jobs(body["id"])
    run_jobs(engine, [done])
    assert job_claim(job_id=running.pk, worker="w1") is not None

    response = alice.client.post(f"/v1/batches/{body['id']}/cancel")

    assert response.status_code == 202, response.json()
    manifest = response.json()
    assert manifest["status"] == "cancelling"
    assert (manifest["counts"]["succeeded"], manifest["counts"]["cancelled"]) == (1, 4)
    assert {item["status"] for item in manifest["items"]["results"][1:]} == {"cancelled"}
    _assert_refunded_once([running, *waiting])
    assert _ledger(done) == [("commit", done.characters), ("reserve", done.characters)]
    period = UsagePeriod.objects.get(tenant=alice.tenant)
    assert (period.characters_reserved, period.characters_used) == (0, done.characters)
    assert (period.jobs_succeeded, period.jobs_cancelled) == (1, 4)
    assert counters_reconcile() == 0  # the recount agrees with the set-based refunds
    # The running item's worker stops at its next look; the queued ones' messages
    # are skipped: nothing more is charged.
    assert job_execute(job_id=running.pk, engine=engine, worker="w1")["status"] == "skipped"
    run_jobs(engine, waiting)
    assert LedgerEntry.objects.filter(tenant=alice.tenant, kind="commit").count() == 1

    assert batch_cancel_finish(batch_id=uuid.UUID(body["id"]))

    batch = Batch.objects.get(pk=body["id"])
    assert batch.status == BatchStatus.CANCELLED
    assert batch.finished_at is not None
    assert completions == [(batch.pk, "cancelled")]
    assert not batch_cancel_finish(batch_id=batch.pk)  # ended once
    assert len(completions) == 1


def test_a_cancel_costs_the_same_few_statements_whatever_the_batch_size(
    alice: Persona, broker: Any, light_queue: Any
) -> None:
    body = submit(alice, _items(100)).json()  # the free plan's most

    with CaptureQueriesContext(connection) as queries:
        response = alice.client.post(f"/v1/batches/{body['id']}/cancel?limit=1")

    assert response.status_code == 202, response.json()
    # One statement stops every item, one refunds them; the rest is the request's
    # own (auth, the batch, its manifest). Item by item it was 1,000 and more.
    assert len(queries) < 30, [q["sql"][:80] for q in queries]
    assert response.json()["counts"]["cancelled"] == 100
    _assert_refunded_once(_jobs(body["id"]))
    assert UsagePeriod.objects.get(tenant=alice.tenant).characters_reserved == 0


def test_an_item_cancelled_while_it_runs_stops_and_is_refunded_not_charged(
    alice: Persona, broker: Any, light_queue: Any, engine: Engine
) -> None:
    body = submit(alice, _items(2)).json()
    first, second = _jobs(body["id"])
    midway = CancelledMidway(
        engine, between=lambda: alice.client.post(f"/v1/batches/{body['id']}/cancel")
    )

    result = job_execute(job_id=first.pk, engine=midway, worker="w1")  # type: ignore[arg-type]

    assert result["status"] == "cancelled"
    _assert_refunded_once([first, second])
    assert UsagePeriod.objects.get(tenant=alice.tenant).characters_used == 0


def test_no_item_of_a_cancelling_batch_is_claimed_and_the_sweeper_ends_it(
    alice: Persona, broker: Any, light_queue: Any, engine: Engine, completions: list[Any]
) -> None:
    # Items still in line under a batch marked cancelling: admitted after the
    # cancel's stop (a chunked admission), or put back in line by a redelivery.
    body = submit(alice, _items(3)).json()
    Batch.objects.filter(pk=body["id"]).update(status="cancelling")

    run_jobs(engine, waiting_jobs(body["id"]))

    assert {job.status for job in _jobs(body["id"])} == {JobStatus.QUEUED}
    assert not LedgerEntry.objects.filter(tenant=alice.tenant, kind="commit").exists()

    sweep()

    _assert_refunded_once(_jobs(body["id"]))
    assert Batch.objects.get(pk=body["id"]).status == BatchStatus.CANCELLED
    assert completions == [(uuid.UUID(body["id"]), "cancelled")]


def test_a_cancel_left_part_way_is_finished_by_a_second_cancel_and_no_item_starts(
    alice: Persona, broker: Any, light_queue: Any, engine: Engine, completions: list[Any]
) -> None:
    # What a cancel stopped part-way left (the web process killed during an
    # item-by-item cancel): the batch cancelled, two items refunded, three pending.
    body = submit(alice, _items(5)).json()
    jobs = _jobs(body["id"])
    alice.client.post(f"/v1/speech/{jobs[0].pk}/cancel")
    alice.client.post(f"/v1/speech/{jobs[1].pk}/cancel")
    Batch.objects.filter(pk=body["id"]).update(status="cancelled")
    Job.objects.filter(pk__in=[job.pk for job in jobs[2:]]).update(status=JobStatus.PENDING)
    Job.objects.filter(pk=jobs[2].pk).update(status=JobStatus.QUEUED)

    # The broker still holds a message for the queued one: it does not start.
    assert job_execute(job_id=jobs[2].pk, engine=engine, worker="w1")["status"] == "skipped"
    again = alice.client.post(f"/v1/batches/{body['id']}/cancel")

    assert again.status_code == 202, again.json()
    assert again.json()["counts"]["cancelled"] == 3  # the queued one now, then the rest:
    batch_cancel_finish(batch_id=uuid.UUID(body["id"]))  # as the light worker does
    _assert_refunded_once(jobs)  # the two refunded before are not refunded again
    period = UsagePeriod.objects.get(tenant=alice.tenant)
    assert (period.characters_reserved, period.characters_used, period.jobs_cancelled) == (0, 0, 5)
    assert completions == []  # the batch had ended already: no second event
    last = alice.client.post(f"/v1/batches/{body['id']}/cancel")
    assert last.status_code == 409
    assert last.json()["error"]["code"] == "batch_not_cancellable"


def test_pending_items_are_cancelled_in_chunks_after_the_answer_and_none_starts(
    alice: Persona,
    broker: Any,
    light_queue: Any,
    engine: Engine,
    completions: list[Any],
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings.TENANT_BROKER_SLOTS = 2  # fair admission: two queued, the rest pending
    monkeypatch.setattr(cancelling, "CHUNK", 3)
    body = submit(alice, _items(10)).json()
    jobs = _jobs(body["id"])
    assert [job.status for job in jobs].count(JobStatus.QUEUED) == 2

    response = alice.client.post(f"/v1/batches/{body['id']}/cancel")

    counts = response.json()["counts"]
    assert (counts["cancelled"], counts["pending"]) == (2, 8)
    # Pending items let into the broker before the light worker gets to them
    # (a claim elsewhere frees a slot) are skipped by the workers.
    assert admission_refill(tenant_id=alice.tenant.pk, priority="low") == 2
    run_jobs(engine, waiting_jobs(body["id"]))
    assert not LedgerEntry.objects.filter(tenant=alice.tenant, kind="commit").exists()

    # The sweeper's bounded pass: two chunks of three, the batch not ended yet.
    assert not batch_cancel_finish(batch_id=uuid.UUID(body["id"]), max_chunks=2)
    assert Job.objects.filter(batch_item__batch_id=body["id"], status="cancelled").count() == 8
    assert batch_cancel_finish(batch_id=uuid.UUID(body["id"]))

    _assert_refunded_once(jobs)
    period = UsagePeriod.objects.get(tenant=alice.tenant)
    assert (period.characters_reserved, period.characters_used, period.jobs_cancelled) == (
        0,
        0,
        10,
    )
    assert counters_reconcile() == 0
    assert completions == [(uuid.UUID(body["id"]), "cancelled")]


def test_a_cancel_whose_end_was_lost_is_ended_by_the_sweeper_and_may_be_repeated(
    alice: Persona,
    broker: Any,
    light_queue: Any,
    completions: list[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The web process died right after the cancel committed: no end was sent.
    monkeypatch.setattr(cancelling, "_send_finish", lambda *, batch_id: None)
    body = submit(alice, _items(3)).json()
    first = alice.client.post(f"/v1/batches/{body['id']}/cancel")
    second = alice.client.post(f"/v1/batches/{body['id']}/cancel")

    assert (first.status_code, second.status_code) == (202, 202)
    assert second.json()["status"] == "cancelling"
    assert light_queue.llen("light") == 0
    _assert_refunded_once(_jobs(body["id"]))

    sweep()

    assert Batch.objects.get(pk=body["id"]).status == BatchStatus.CANCELLED
    assert completions == [(uuid.UUID(body["id"]), "cancelled")]
    assert light_queue.llen("light") == 1  # its archive
    sweep()
    assert len(completions) == 1
    _assert_refunded_once(_jobs(body["id"]))


def test_cancelling_one_batch_leaves_another_tenants_batch_running(
    alice: Persona, bob: Persona, broker: Any, light_queue: Any
) -> None:
    mine = submit(alice, _items(2)).json()
    theirs = submit(bob, _items(2)).json()

    assert alice.client.post(f"/v1/batches/{mine['id']}/cancel").status_code == 202

    assert Batch.objects.get(pk=theirs["id"]).status == BatchStatus.RUNNING
    assert {job.status for job in _jobs(theirs["id"])} == {JobStatus.QUEUED}
    assert not LedgerEntry.objects.filter(tenant=bob.tenant, kind="refund").exists()
    assert BatchItem.objects.filter(batch_id=theirs["id"]).count() == 2
