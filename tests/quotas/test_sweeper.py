"""The sweeper repairs what crashes, lost messages and time leave behind."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.forms.models import model_to_dict
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from quotas.models import LedgerEntry, LedgerKind, UsagePeriod
from quotas.services import quota_reserve, usage_period_current
from synthesis.engines.base import Engine
from synthesis.models import Job, JobStatus
from synthesis.services.execution import MAX_ATTEMPTS, job_claim, job_execute
from synthesis.services.jobs import job_create
from synthesis.services.sweeper import STUCK_GRACE, SweepReport, sweep
from synthesis.speech_request import SpeechRequest
from tests.conftest import Persona


@pytest.fixture
def republished(monkeypatch: pytest.MonkeyPatch) -> list[uuid.UUID]:
    """Jobs the sweeper hands back to the broker (recorded, not sent)."""
    sent: list[uuid.UUID] = []

    def record(*, job: Job) -> None:
        sent.append(job.id)

    monkeypatch.setattr("synthesis.services.sweeper.job_publish", record)
    monkeypatch.setattr("synthesis.services.recovery.job_publish", record)
    return sent


def submit(persona: Persona, text: str = "Sweep me up.") -> Job:
    return job_create(
        tenant=persona.tenant, api_key=persona.api_key, speech=SpeechRequest(text=text)
    )


def claimed(job: Job, *, times: int, started_ago: timedelta) -> Job:
    for n in range(times):
        assert job_claim(job_id=job.id, worker=f"w{n}") is not None
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - started_ago)
    return Job.objects.get(pk=job.pk)


def settlements(job: Job) -> list[str]:
    return list(
        LedgerEntry.objects.filter(job=job).exclude(kind="reserve").values_list("kind", flat=True)
    )


def snapshot() -> dict[str, list[dict[str, Any]]]:
    return {
        "jobs": list(Job.objects.order_by("id").values()),
        "ledger": list(LedgerEntry.objects.order_by("id").values()),
        "periods": list(UsagePeriod.objects.order_by("id").values()),
    }


OVERDUE = timedelta(seconds=settings.TASK_TIME_LIMIT_S) + STUCK_GRACE + timedelta(minutes=1)


# --- stuck jobs -------------------------------------------------------------------


def test_a_job_stuck_running_is_requeued_and_republished_while_attempts_remain(
    alice: Persona, republished: list[uuid.UUID]
) -> None:
    job = claimed(submit(alice), times=MAX_ATTEMPTS - 1, started_ago=OVERDUE)

    report = sweep()

    assert report == SweepReport(requeued=1)
    job.refresh_from_db()
    assert (job.status, job.attempts) == (JobStatus.QUEUED, MAX_ATTEMPTS - 1)
    assert republished == [job.id]
    assert settlements(job) == []
    assert usage_period_current(tenant=alice.tenant).characters_reserved == job.characters


def test_a_job_stuck_after_its_last_attempt_fails_and_is_refunded(
    alice: Persona, republished: list[uuid.UUID]
) -> None:
    job = claimed(submit(alice), times=MAX_ATTEMPTS, started_ago=OVERDUE)

    report = sweep()

    assert report == SweepReport(failed=1)
    job.refresh_from_db()
    assert (job.status, job.error_code) == (JobStatus.FAILED, "worker_lost")
    assert job.finished_at is not None
    assert republished == []
    assert settlements(job) == [LedgerKind.REFUND]
    period = usage_period_current(tenant=alice.tenant)
    assert (period.characters_used, period.characters_reserved) == (0, 0)


def test_a_job_running_within_its_time_limit_is_left_alone(
    alice: Persona, republished: list[uuid.UUID]
) -> None:
    job = claimed(submit(alice), times=MAX_ATTEMPTS, started_ago=timedelta(seconds=5))
    before = model_to_dict(job)

    assert sweep() == SweepReport()

    assert model_to_dict(Job.objects.get(pk=job.pk)) == before
    assert republished == []


def test_a_requeued_job_runs_to_success_and_is_charged_once(
    alice: Persona, engine: Engine, republished: list[uuid.UUID]
) -> None:
    job = claimed(submit(alice), times=1, started_ago=OVERDUE)
    sweep()

    job_execute(job_id=job.id, engine=engine, worker="w-new")

    job.refresh_from_db()
    assert (job.status, job.attempts) == (JobStatus.SUCCEEDED, 2)
    assert settlements(job) == [LedgerKind.COMMIT]


# --- orphan reservations ----------------------------------------------------------


@pytest.mark.parametrize(
    ("final", "settled_as"),
    [
        (JobStatus.SUCCEEDED, LedgerKind.COMMIT),
        (JobStatus.FAILED, LedgerKind.REFUND),
        (JobStatus.CANCELLED, LedgerKind.REFUND),
    ],
)
def test_a_finished_job_with_an_unsettled_reservation_is_settled(
    alice: Persona, republished: list[uuid.UUID], final: str, settled_as: str
) -> None:
    # As if the process died between writing the job's final state and settling.
    period = usage_period_current(tenant=alice.tenant)
    job = Job.objects.create(
        tenant=alice.tenant, text="o" * 21, characters=21, status=final, finished_at=timezone.now()
    )
    quota_reserve(period=period, job_id=job.id, characters=21)

    report = sweep()

    assert report == SweepReport(settled=1)
    assert settlements(job) == [settled_as]
    period.refresh_from_db()
    assert period.characters_reserved == 0
    assert period.characters_used == (21 if settled_as == LedgerKind.COMMIT else 0)


def test_jobs_in_flight_and_settled_jobs_are_not_orphans(
    alice: Persona, engine: Engine, republished: list[uuid.UUID]
) -> None:
    queued = submit(alice)
    done = submit(alice)
    job_execute(job_id=done.id, engine=engine, worker="w1")

    assert sweep().settled == 0

    assert settlements(queued) == []
    assert settlements(done) == [LedgerKind.COMMIT]


# --- output retention -------------------------------------------------------------


def stored(persona: Persona, job: Job) -> Path:
    return Path(settings.STORAGE["local_root"]) / persona.tenant.bucket / job.output_key


def finished_days_ago(job: Job, days: float) -> None:
    Job.objects.filter(pk=job.pk).update(finished_at=timezone.now() - timedelta(days=days))


def test_audio_past_its_retention_is_deleted_and_no_longer_linked(
    alice: Persona, engine: Engine, republished: list[uuid.UUID]
) -> None:
    retention = alice.tenant.plan.output_retention_days
    old, recent = submit(alice), submit(alice)
    for job in (old, recent):
        job_execute(job_id=job.id, engine=engine, worker="w1")
        job.refresh_from_db()
    finished_days_ago(old, retention + 0.1)
    finished_days_ago(recent, retention - 0.1)
    assert alice.client.get(f"/v1/speech/{old.id}").json()["audio_url"]

    report = sweep()

    assert report == SweepReport(expired=1)
    old.refresh_from_db()
    assert old.output_deleted_at is not None
    assert not stored(alice, old).exists()
    body = alice.client.get(f"/v1/speech/{old.id}").json()
    assert (body["status"], body["audio_url"], body["audio_url_expires_at"]) == (
        "succeeded",
        None,
        None,
    )
    assert stored(alice, recent).exists()
    assert alice.client.get(f"/v1/speech/{recent.id}").json()["audio_url"]
    # Expired audio no longer counts against storage.
    usage = alice.client.get("/v1/usage").json()
    assert usage["storage_bytes"]["used"] == recent.output_bytes


def test_retention_follows_the_tenants_override(
    alice: Persona, engine: Engine, republished: list[uuid.UUID]
) -> None:
    job = submit(alice)
    job_execute(job_id=job.id, engine=engine, worker="w1")
    job.refresh_from_db()
    finished_days_ago(job, 2)
    assert sweep().expired == 0
    alice.tenant.limit_overrides = {"output_retention_days": 1}
    alice.tenant.save(update_fields=["limit_overrides"])

    assert sweep().expired == 1

    assert not stored(alice, job).exists()


def test_expiry_works_off_a_backlog_in_batches(
    alice: Persona, engine: Engine, republished: list[uuid.UUID], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("synthesis.services.sweeper.EXPIRY_BATCH", 2)
    jobs = [submit(alice) for _ in range(5)]
    for job in jobs:
        job_execute(job_id=job.id, engine=engine, worker="w1")
        finished_days_ago(job, 400)

    assert [sweep().expired for _ in range(4)] == [2, 2, 1, 0]

    assert not Job.objects.filter(output_deleted_at__isnull=True).exists()
    assert alice.client.get("/v1/usage").json()["storage_bytes"]["used"] == 0


def test_a_job_finished_long_ago_is_not_searched_for_an_unsettled_reservation(
    alice: Persona, republished: list[uuid.UUID]
) -> None:
    job = Job.objects.create(
        tenant=alice.tenant,
        text="o" * 9,
        characters=9,
        status=JobStatus.FAILED,
        finished_at=timezone.now() - timedelta(days=2),
    )
    quota_reserve(period=usage_period_current(tenant=alice.tenant), job_id=job.id, characters=9)

    assert sweep().settled == 0


# --- idempotence ------------------------------------------------------------------


def test_a_second_sweep_changes_nothing(
    alice: Persona, engine: Engine, republished: list[uuid.UUID]
) -> None:
    claimed(submit(alice), times=1, started_ago=OVERDUE)
    claimed(submit(alice), times=MAX_ATTEMPTS, started_ago=OVERDUE)
    orphan = Job.objects.create(
        tenant=alice.tenant,
        text="o" * 9,
        characters=9,
        status=JobStatus.FAILED,
        finished_at=timezone.now(),
    )
    quota_reserve(period=usage_period_current(tenant=alice.tenant), job_id=orphan.id, characters=9)
    expired = submit(alice)
    job_execute(job_id=expired.id, engine=engine, worker="w1")
    expired.refresh_from_db()
    finished_days_ago(expired, 365)

    first = sweep()
    after_first, published_once = snapshot(), list(republished)
    second = sweep()

    assert first == SweepReport(requeued=1, failed=1, settled=1, expired=1)
    assert second == SweepReport()
    assert snapshot() == after_first
    assert republished == published_once


@pytest.mark.skipif(connection.vendor != "postgresql", reason="reads PostgreSQL's plans")
def test_expiry_reads_the_oldest_retained_audio_off_an_index(alice: Persona) -> None:
    with CaptureQueriesContext(connection) as queries:
        sweep()
    expiry = next(q["sql"] for q in queries if 'AS "output_key"' in q["sql"])
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {expiry}")
        plan = "\n".join(row[0] for row in cursor.fetchall())

    assert "job_output_expiry" in plan, plan
    assert "Sort" not in plan, plan
