"""Fair admission, aging, epochs, retries and idempotency (service layer, real
PostgreSQL). Publishing is recorded instead of sent: the broker is covered by
the end-to-end tests."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from chorus.errors import StorageError
from chorus.statements import execute_together
from quotas.models import LedgerEntry, LedgerKind
from synthesis.engines.base import Engine
from synthesis.line_counts import waiting_from_rows, waiting_statement
from synthesis.models import IdempotencyKey, Job, JobStatus
from synthesis.services.dispatch import (
    admission_refill,
    admission_refill_all,
    job_publish,
    jobs_age,
)
from synthesis.services.execution import MAX_ATTEMPTS, job_claim, job_execute
from synthesis.services.jobs import IdempotencyKeyReused, job_cancel, job_create
from synthesis.services.sweeper import sweep
from synthesis.speech_request import SpeechRequest
from tests.conftest import Persona
from tests.lock_waits import lock_waiters

# Transactional: jobs are published on commit, as in production.
pytestmark = pytest.mark.django_db(transaction=True)


def count_waiting(*, tenant_id: int, priority: str, slots: int) -> tuple[int, int]:
    """(pending, queued) jobs of the tenant at `priority`, as the look reads them."""
    [rows] = execute_together(
        [waiting_statement(tenant_id=tenant_id, priority=priority, slots=slots)]
    )
    return waiting_from_rows(rows)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[uuid.UUID, str, float | None]]:
    """(job id, queue, countdown) of every publish, in order."""
    published: list[tuple[uuid.UUID, str, float | None]] = []

    def publish(_: Any, *, args: Any, queue: str, countdown: float = 0, **__: Any) -> None:
        published.append((uuid.UUID(args[0]), queue, countdown or None))

    monkeypatch.setattr("synthesis.tasks.publish_task", publish)
    return published


@pytest.fixture
def two_slots(settings: Any) -> None:
    settings.TENANT_BROKER_SLOTS = 2


def submit(
    persona: Persona,
    text: str = "Hello there.",
    priority: str = "normal",
    idempotency_key: str = "",
) -> Job:
    return job_create(
        tenant=persona.tenant,
        api_key=persona.api_key,
        speech=SpeechRequest(text=text),
        priority=priority,
        idempotency_key=idempotency_key,
    )


def statuses(persona: Persona) -> list[str]:
    return list(
        Job.objects.filter(tenant=persona.tenant)
        .order_by("created_at")
        .values_list("status", flat=True)
    )


@pytest.mark.usefixtures("two_slots")
def test_a_tenant_keeps_only_its_slots_in_the_broker_and_the_rest_wait_pending(
    alice: Persona, sent: list[Any]
) -> None:
    with_commits = [submit(alice, priority="low") for _ in range(5)]

    assert statuses(alice) == ["queued", "queued", "pending", "pending", "pending"]
    assert [job_id for job_id, _, _ in sent] == [job.id for job in with_commits[:2]]


@pytest.mark.usefixtures("two_slots")
def test_another_tenants_jobs_go_straight_into_the_broker_past_a_backlog(
    alice: Persona, bob: Persona, sent: list[Any]
) -> None:
    for _ in range(10):
        submit(alice, priority="low")
    bobs = [submit(bob, priority="low") for _ in range(2)]

    assert statuses(bob) == ["queued", "queued"]
    # In the low queue, bob's jobs stand right behind alice's two, not her ten.
    assert [job_id for job_id, _, _ in sent][2:] == [job.id for job in bobs]


@pytest.mark.usefixtures("two_slots")
def test_claiming_a_queued_job_releases_the_tenants_oldest_pending_one(
    alice: Persona, sent: list[Any]
) -> None:
    jobs = [submit(alice, priority="low") for _ in range(4)]

    assert job_claim(job_id=jobs[0].id, worker="w1", epoch=1) is not None

    assert statuses(alice) == ["running", "queued", "queued", "pending"]
    assert sent[-1][0] == jobs[2].id


@pytest.mark.usefixtures("two_slots")
def test_a_claim_and_its_look_for_a_job_to_release_are_one_round_trip(
    alice: Persona, sent: list[Any]
) -> None:
    """On the way to a stream's first audio: the claim, its commit and the look
    go as one string; only a look that finds a job to release costs more."""
    first, second = submit(alice), submit(alice)
    job_claim(job_id=first.id, worker="w1", epoch=1)  # prepares the named statements

    with CaptureQueriesContext(connection) as queries:
        assert job_claim(job_id=second.id, worker="w1", epoch=1) is not None

    sent_sql = [q["sql"] for q in queries.captured_queries if not q["sql"].startswith("PREPARE")]
    assert len(sent_sql) == 1, sent_sql
    assert "COMMIT" in sent_sql[0]
    assert statuses(alice) == ["running", "running"]


@pytest.mark.embedded
@pytest.mark.usefixtures("two_slots")
def test_the_look_for_a_job_to_release_counts_only_as_far_as_it_decides(
    alice: Persona, sent: list[Any]
) -> None:
    """A claim's look reads whether a job is pending and whether the slots are
    full, not the whole line (a batch can hold thousands of pending items)."""
    jobs = [submit(alice, priority="low") for _ in range(6)]
    look = {"tenant_id": alice.tenant.pk, "slots": 2}

    assert count_waiting(priority="low", **look) == (1, 2)
    assert count_waiting(priority="normal", **look) == (0, 0)
    assert job_claim(job_id=jobs[0].id, worker="w1", epoch=1) is not None
    assert statuses(alice) == ["running", "queued", "queued", "pending", "pending", "pending"]
    assert count_waiting(priority="low", **look) == (1, 2)
    assert count_waiting(priority="low", tenant_id=alice.tenant.pk, slots=5) == (1, 2)


@pytest.mark.usefixtures("two_slots")
def test_cancelling_a_queued_job_releases_a_pending_one(alice: Persona, sent: list[Any]) -> None:
    jobs = [submit(alice) for _ in range(3)]

    job_cancel(tenant=alice.tenant, job=jobs[0])

    assert statuses(alice) == ["cancelled", "queued", "queued"]
    assert sent[-1][0] == jobs[2].id


@pytest.mark.embedded  # SQLite runs each write transaction alone: no race there
@pytest.mark.usefixtures("two_slots")
def test_a_slot_freed_while_a_submit_is_uncommitted_releases_its_held_back_job(
    alice: Persona, sent: list[Any]
) -> None:
    """The race the sweeper would otherwise have to mend, 30 s later: a submit
    reads its line (both slots taken) and holds its job back; before it commits,
    a claim frees a slot and looks for a pending job, which it cannot see yet."""
    first, _ = submit(alice), submit(alice)
    inserted, commit = threading.Event(), threading.Event()
    held: list[Job] = []
    claimed: list[Any] = []

    def submit_slowly() -> None:
        try:
            with transaction.atomic():  # its commit waits for the claim below
                held.append(submit(alice))
                inserted.set()
                assert commit.wait(10)
        finally:
            connection.close()

    def claim() -> None:
        try:
            claimed.append(job_claim(job_id=first.id, worker="w1", epoch=1))
        finally:
            connection.close()

    submitter = threading.Thread(target=submit_slowly, daemon=True)
    submitter.start()
    assert inserted.wait(10)
    assert held[0].status == JobStatus.PENDING
    claimer = threading.Thread(target=claim, daemon=True)
    claimer.start()
    # Until the claim has looked, or waits for the submit's lock (on SQLite, for
    # its write lock: half a second).
    deadline = time.monotonic() + (10 if connection.vendor == "postgresql" else 0.5)
    while claimer.is_alive() and not lock_waiters() and time.monotonic() < deadline:
        time.sleep(0.02)
    commit.set()
    submitter.join(10)
    claimer.join(10)

    assert claimed[0] is not None
    assert statuses(alice) == ["running", "queued", "queued"]
    assert sent[-1][0] == held[0].id


def test_a_message_from_an_earlier_publish_is_ignored(alice: Persona, engine: Engine) -> None:
    job = submit(alice)
    Job.objects.filter(pk=job.pk).update(epoch=2)  # republished since (aging, retry)

    assert job_execute(job_id=job.id, engine=engine, worker="w1", epoch=1)["status"] == "skipped"
    assert job_execute(job_id=job.id, engine=engine, worker="w1", epoch=2)["status"] == (
        "succeeded"
    )


def test_waiting_jobs_age_one_priority_up_and_are_republished(
    alice: Persona, sent: list[Any], settings: Any
) -> None:
    settings.AGE_LOW_TO_NORMAL_S, settings.AGE_NORMAL_TO_HIGH_S = 60, 120
    settings.AGING_CEILING = "high"
    old_low, old_normal, fresh_low = (
        submit(alice, priority="low"),
        submit(alice, priority="normal"),
        submit(alice, priority="low"),
    )
    Job.objects.filter(pk=old_low.pk).update(created_at=timezone.now() - timedelta(seconds=90))
    Job.objects.filter(pk=old_normal.pk).update(created_at=timezone.now() - timedelta(seconds=150))
    sent.clear()

    assert jobs_age() == 2

    priorities = dict(Job.objects.values_list("pk", "priority"))
    assert priorities == {old_low.pk: "normal", old_normal.pk: "high", fresh_low.pk: "low"}
    assert sorted((job_id, queue) for job_id, queue, _ in sent) == sorted(
        [(old_low.id, "synth.normal"), (old_normal.id, "synth.high")]
    )
    assert jobs_age() == 0  # one step per threshold, not a republish every sweep


def test_aging_never_lifts_a_backlog_into_high_by_default(
    alice: Persona, sent: list[Any], settings: Any
) -> None:
    settings.AGE_LOW_TO_NORMAL_S, settings.AGE_NORMAL_TO_HIGH_S = 60, 120
    jobs = [submit(alice, priority="low") for _ in range(3)]
    Job.objects.update(created_at=timezone.now() - timedelta(hours=1))

    assert jobs_age() == 3  # low -> normal
    assert jobs_age() == 0  # and no further: high is for requests that ask for it
    assert set(
        Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("priority", flat=True)
    ) == {"normal"}


def test_aging_never_gives_a_priority_the_tenants_plan_does_not_include(
    alice: Persona, sent: list[Any], settings: Any
) -> None:
    settings.AGE_LOW_TO_NORMAL_S = 60
    alice.tenant.limit_overrides = {"allowed_priorities": ["low"]}
    alice.tenant.save()
    job = submit(alice, priority="low")
    Job.objects.update(created_at=timezone.now() - timedelta(hours=1))

    assert jobs_age() == 0
    assert Job.objects.get(pk=job.pk).priority == "low"


@pytest.mark.usefixtures("two_slots")
def test_the_release_pass_refills_each_tenant_and_priority_with_room_once(
    alice: Persona, bob: Persona, sent: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for who, priority in [(alice, "low")] * 6 + [(alice, "normal")] * 4 + [(bob, "low")] * 5:
        submit(who, priority=priority)
    submit(bob, priority="normal")
    for who, priority in [(alice, "low"), (alice, "normal"), (bob, "low")]:
        # A claim freed a slot; its own refill has not run yet.
        job = Job.objects.filter(tenant=who.tenant, priority=priority, status="queued").first()
        Job.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING)
    full = submit(alice, text="Full.", priority="high")  # queued, nothing pending
    for _ in range(3):
        submit(bob, text="Waits.", priority="high")  # two queued, one pending: no room
    assert full.status == "queued"
    calls: list[tuple[int, str]] = []

    def refill(*, tenant_id: int, priority: str) -> int:
        calls.append((tenant_id, priority))
        return 0

    monkeypatch.setattr("synthesis.services.dispatch.admission_refill", refill)

    admission_refill_all()

    assert sorted(calls) == sorted(
        [(alice.tenant.pk, "low"), (alice.tenant.pk, "normal"), (bob.tenant.pk, "low")]
    )


def test_aging_moves_a_bounded_batch_per_pass_in_a_few_statements(
    alice: Persona,
    sent: list[Any],
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    django_assert_max_num_queries: Any,
) -> None:
    settings.AGE_LOW_TO_NORMAL_S = 60
    settings.TENANT_BROKER_SLOTS = 2
    monkeypatch.setattr("synthesis.services.dispatch.AGING_BATCH", 25)
    jobs = [submit(alice, priority="low") for _ in range(30)]  # 2 queued, 28 pending
    Job.objects.update(created_at=timezone.now() - timedelta(hours=1))
    sent.clear()

    with django_assert_max_num_queries(15):  # not one or two per job
        assert jobs_age() == 25

    assert jobs_age() == 5
    assert set(Job.objects.values_list("priority", flat=True)) == {"normal"}
    # The two that were in the broker went out again on the normal queue.
    assert sorted(job_id for job_id, queue, _ in sent if queue == "synth.normal") == sorted(
        job.id for job in jobs[:2]
    )


@pytest.mark.usefixtures("two_slots")
def test_a_new_job_waits_behind_the_tenants_older_pending_ones(
    alice: Persona, sent: list[Any]
) -> None:
    jobs = [submit(alice, priority="low") for _ in range(4)]  # 2 queued, 2 pending
    job_cancel(tenant=alice.tenant, job=jobs[0])  # frees a slot: jobs[2] is released
    # A slot is free again once jobs[1] is claimed (by a worker that died before
    # its refill), but jobs[3] still waits: the next submission must not take the
    # slot ahead of it.
    Job.objects.filter(pk=jobs[1].pk).update(status=JobStatus.RUNNING)
    late = submit(alice, priority="low")
    assert Job.objects.get(pk=late.pk).status == "pending"

    admission_refill_all()  # the sweeper's pass

    # The older pending job takes the free slot; the new one waits its turn.
    assert Job.objects.get(pk=late.pk).status == "pending"
    assert Job.objects.get(pk=jobs[3].pk).status == "queued"
    assert [job_id for job_id, _, _ in sent] == [job.id for job in jobs]


def test_a_storage_outage_past_the_retry_window_requeues_with_backoff_then_fails_and_refunds(
    alice: Persona,
    engine: Engine,
    sent: list[Any],
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> None:
    def unavailable(**kwargs: Any) -> None:
        raise StorageError("Object storage is unavailable.")

    settings.STORAGE_RETRY_WINDOW_S = 0  # each attempt's write is tried once

    job = submit(alice)
    monkeypatch.setattr(
        "synthesis.storage.local.LocalStorage.put", lambda self, **kw: unavailable()
    )

    for attempt in range(1, MAX_ATTEMPTS):
        result = job_execute(job_id=job.id, engine=engine, worker="w1", epoch=attempt)
        assert result["status"] == "retrying"
        assert Job.objects.get(pk=job.pk).status == JobStatus.QUEUED
        countdown = sent[-1][2]
        assert countdown is not None
        assert countdown > 0  # published with a backoff
    result = job_execute(job_id=job.id, engine=engine, worker="w1", epoch=MAX_ATTEMPTS)

    job.refresh_from_db()
    assert (result["status"], job.status, job.error_code) == (
        "failed",
        JobStatus.FAILED,
        "storage_unavailable",
    )
    assert LedgerEntry.objects.filter(job=job, kind=LedgerKind.REFUND).count() == 1


def test_a_job_whose_publish_was_lost_is_published_by_the_sweeper(
    alice: Persona, sent: list[Any]
) -> None:
    job = submit(alice)
    Job.objects.filter(pk=job.pk).update(
        published_at=None, created_at=timezone.now() - timedelta(minutes=2)
    )
    sent.clear()

    assert sweep().published == 1
    assert [job_id for job_id, _, _ in sent] == [job.id]
    assert sweep().published == 0


def test_the_same_idempotency_key_and_body_give_the_same_job(alice: Persona) -> None:
    first = submit(alice, idempotency_key="order-42")
    again = submit(alice, idempotency_key="order-42")

    assert again.pk == first.pk
    assert Job.objects.filter(tenant=alice.tenant).count() == 1
    assert LedgerEntry.objects.filter(tenant=alice.tenant, kind=LedgerKind.RESERVE).count() == 1


def test_the_same_idempotency_key_with_another_body_is_refused(alice: Persona) -> None:
    submit(alice, idempotency_key="order-42")

    with pytest.raises(IdempotencyKeyReused):
        submit(alice, text="Something else.", idempotency_key="order-42")
    assert Job.objects.filter(tenant=alice.tenant).count() == 1


def test_idempotency_keys_belong_to_one_tenant(alice: Persona, bob: Persona) -> None:
    assert submit(alice, idempotency_key="k").pk != submit(bob, idempotency_key="k").pk


def test_idempotency_keys_are_forgotten_after_a_day(alice: Persona) -> None:
    first = submit(alice, idempotency_key="order-42")
    IdempotencyKey.objects.update(created_at=timezone.now() - timedelta(hours=25))

    sweep()

    assert not IdempotencyKey.objects.exists()
    assert submit(alice, idempotency_key="order-42").pk != first.pk


def test_the_api_answers_a_repeated_key_with_the_same_job_and_409_for_another_body(
    alice: Persona,
) -> None:
    headers = {"HTTP_IDEMPOTENCY_KEY": "req-1"}
    body = {"text": "Same request."}
    first = alice.client.post("/v1/speech", body, format="json", **headers)
    again = alice.client.post("/v1/speech", body, format="json", **headers)
    other = alice.client.post("/v1/speech", {"text": "Other."}, format="json", **headers)

    assert (first.status_code, again.status_code) == (202, 202)
    assert again.json()["id"] == first.json()["id"]
    assert other.status_code == 409
    assert other.json()["error"]["code"] == "idempotency_key_reused"


def test_a_waiting_job_shows_its_place_in_line(alice: Persona, bob: Persona) -> None:
    low = submit(alice, priority="low")
    normal_a = submit(alice, priority="normal")
    normal_b = submit(bob, priority="normal")
    high = submit(bob, priority="high")

    places = {
        job.pk: alice_or_bob.client.get(f"/v1/speech/{job.pk}").json()["queue"]["position"]
        for job, alice_or_bob in [(low, alice), (normal_a, alice), (normal_b, bob), (high, bob)]
    }
    assert places == {high.pk: 0, normal_a.pk: 1, normal_b.pk: 2, low.pk: 3}


def test_an_expired_key_not_yet_swept_starts_a_new_job(alice: Persona) -> None:
    first = submit(alice, idempotency_key="order-42")
    IdempotencyKey.objects.update(created_at=timezone.now() - timedelta(hours=25))

    again = submit(alice, idempotency_key="order-42")

    assert again.pk != first.pk
    assert IdempotencyKey.objects.get().job_id == again.pk


def test_the_task_passes_its_epoch_so_a_stale_message_claims_nothing(alice: Persona) -> None:
    from synthesis.tasks import synthesize_job_task

    job = submit(alice)
    Job.objects.filter(pk=job.pk).update(epoch=5)  # republished since

    assert synthesize_job_task(str(job.id), 1)["status"] == "skipped"
    assert Job.objects.get(pk=job.pk).attempts == 0


def test_a_queued_job_whose_message_was_lost_is_published_again(
    alice: Persona, sent: list[Any], settings: Any
) -> None:
    job = submit(alice, priority="high")
    long_ago = timezone.now() - timedelta(seconds=settings.BROKER_VISIBILITY_TIMEOUT_S + 60)
    Job.objects.filter(pk=job.pk).update(published_at=long_ago)
    sent.clear()

    assert sweep().published == 1
    assert [(job_id, queue) for job_id, queue, _ in sent] == [(job.id, "synth.high")]
    assert Job.objects.get(pk=job.pk).epoch == 2  # the lost message, if it turns up, is stale


def test_a_new_job_goes_out_with_the_first_epoch_and_is_stamped_published(
    alice: Persona, sent: list[Any]
) -> None:
    job = submit(alice)
    job.refresh_from_db()
    assert [job_id for job_id, _, _ in sent] == [job.id]
    assert job.epoch == 1
    assert job.published_at is not None


def test_a_republish_of_a_job_a_worker_took_meanwhile_sends_nothing(
    alice: Persona, sent: list[Any]
) -> None:
    """The sweeper read the job as queued; its first message was claimed before
    the republish: the running attempt keeps its epoch and is not duplicated."""
    job = submit(alice)
    sent.clear()
    assert job_claim(job_id=job.id, worker="w1", epoch=1) is not None

    assert job_publish(job=job) is True
    assert sent == []
    assert Job.objects.get(pk=job.pk).epoch == 1


def test_a_key_whose_job_never_reached_the_queue_can_be_retried(
    alice: Persona, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kombu.exceptions import OperationalError

    from synthesis.services.jobs import QueueUnavailable

    def broker_down(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("connection refused")

    with monkeypatch.context() as patch:
        patch.setattr("synthesis.tasks.publish_task", broker_down)
        with pytest.raises(QueueUnavailable):
            submit(alice, idempotency_key="order-7")

    retried = submit(alice, idempotency_key="order-7")

    assert retried.status == JobStatus.QUEUED
    assert Job.objects.filter(tenant=alice.tenant).count() == 2  # the failed one, and this


@pytest.mark.usefixtures("two_slots")
def test_jobs_released_together_are_published_oldest_first(
    alice: Persona, sent: list[Any], settings: Any
) -> None:
    jobs = [submit(alice, priority="low") for _ in range(6)]  # 2 queued, 4 pending
    settings.TENANT_BROKER_SLOTS = 6
    sent.clear()

    assert admission_refill(tenant_id=alice.tenant.pk, priority="low") == 4

    assert [job_id for job_id, _, _ in sent] == [job.id for job in jobs[2:]]
