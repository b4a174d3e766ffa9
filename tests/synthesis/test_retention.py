"""Row retention: old job rows go, each period's usage stays as it was."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from quotas.models import LedgerEntry, UsagePeriod
from quotas.periods import billing_period
from quotas.services import tenant_anchor
from synthesis.engines.base import Engine
from synthesis.models import FINISHED, IdempotencyKey, Job, JobStatus
from synthesis.services.execution import job_claim, job_execute
from synthesis.services.jobs import job_cancel, job_create
from synthesis.services.retention import (
    PRUNABLE,
    job_relations,
    jobs_prune,
    jobs_prune_batch,
    prune_horizon,
)
from synthesis.services.sweeper import sweep
from synthesis.speech_request import SpeechRequest
from synthesis.storage_runtime import get_storage
from tenants.models import Plan
from tests.conftest import Persona
from tests.fake_engines import FailingEngine


@pytest.fixture(autouse=True)
def published(monkeypatch: pytest.MonkeyPatch) -> list[uuid.UUID]:
    """Jobs handed to the broker, recorded instead of sent (no worker runs here)."""
    sent: list[uuid.UUID] = []

    def record(*, job: Job, countdown: float | None = None) -> bool:
        sent.append(job.id)
        return True

    # Every first message after its commit: none is under way before it.
    monkeypatch.setattr("synthesis.services.jobs.job_publish_before_commit", lambda *, job: None)
    for where in ("jobs.job_publish_created", "sweeper.job_publish", "recovery.job_publish"):
        monkeypatch.setattr(f"synthesis.services.{where}", record)
    monkeypatch.setattr("synthesis.services.execution.job_publish", record)
    monkeypatch.setattr("synthesis.services.dispatch.job_publish", record)
    return sent


def workload(persona: Persona, engine: Engine) -> dict[str, list[Job]]:
    """Jobs in every state, through the services that make them."""

    def submit(n: int, key: str = "") -> Job:
        return job_create(
            tenant=persona.tenant,
            api_key=persona.api_key,
            speech=SpeechRequest(text="x" * n),
            idempotency_key=key,
        )

    jobs: dict[str, list[Job]] = {s: [] for s in ("succeeded", "failed", "cancelled")}
    for n in range(4):
        job = submit(10 + n, key=f"ok-{n}")
        job_execute(job_id=job.id, engine=engine, worker="w1")
        jobs["succeeded"].append(job)
    for n in range(2):
        job = submit(20 + n)
        job_execute(job_id=job.id, engine=FailingEngine(engine), worker="w1")  # type: ignore[arg-type]
        jobs["failed"].append(job)
    job = submit(30)
    job_cancel(tenant=persona.tenant, job=job)
    jobs["cancelled"].append(job)
    running = submit(40)
    assert job_claim(job_id=running.id, worker="w1") is not None
    jobs["unfinished"] = [running, submit(41)]  # running, and waiting in line
    return {status: [Job.objects.get(pk=j.pk) for j in listed] for status, listed in jobs.items()}


def usage(persona: Persona, day: str | None = None) -> dict[str, Any]:
    answer = persona.client.get("/v1/usage", {"period": day} if day else {})
    assert answer.status_code == 200, answer.content
    body: dict[str, Any] = answer.json()
    return body


def past(job: Job, days: int) -> None:
    """Move a job back in time: made that long ago, and finished then if it is."""
    then = timezone.now() - timedelta(days=days)
    Job.objects.filter(pk=job.pk).update(created_at=then)
    Job.objects.filter(pk=job.pk, finished_at__isnull=False).update(finished_at=then)


def test_pruning_keeps_each_periods_usage_and_every_unfinished_job(
    alice: Persona, bob: Persona, engine: Engine
) -> None:
    # Her plan keeps audio longer than the service keeps rows.
    Plan.objects.filter(pk=alice.tenant.plan_id).update(output_retention_days=1000)
    jobs = workload(alice, engine)
    bobs = workload(bob, engine)
    before = usage(alice)
    today = timezone.now().date().isoformat()
    assert usage(alice, today) == before
    jobs_now = before["jobs"]
    assert (jobs_now["succeeded"], jobs_now["failed"], jobs_now["cancelled"]) == (4, 2, 1)
    assert (jobs_now["pending"] + jobs_now["queued"], jobs_now["running"]) == (1, 1)
    for listed in jobs.values():
        for job in listed:
            past(job, days=500)  # every one of alice's jobs, even the unfinished ones

    report = sweep()

    # Gone: her failed and cancelled jobs (no audio), with their ledger entries.
    gone = jobs["failed"] + jobs["cancelled"]
    assert report.pruned == len(gone)
    assert not Job.objects.filter(pk__in=[j.pk for j in gone]).exists()
    assert not LedgerEntry.objects.filter(job_id__in=[j.pk for j in gone]).exists()
    # Kept: unfinished jobs, however old, and successes whose audio is in the bucket.
    kept = jobs["unfinished"] + jobs["succeeded"]
    assert Job.objects.filter(pk__in=[j.pk for j in kept]).count() == len(kept)
    for job in jobs["succeeded"]:
        assert get_storage().exists(bucket=alice.tenant.bucket, key=job.output_key)
    # Bob's recent jobs are untouched.
    assert Job.objects.filter(tenant=bob.tenant).count() == sum(map(len, bobs.values()))

    # Once expiry has deleted the audio, the successes go too, with their
    # Idempotency-Keys.
    assert IdempotencyKey.objects.filter(job__in=jobs["succeeded"]).count() == 4
    Plan.objects.filter(pk=alice.tenant.plan_id).update(output_retention_days=30)
    report = sweep()
    assert report.expired >= 4
    assert report.pruned == 4
    assert not Job.objects.filter(pk__in=[j.pk for j in jobs["succeeded"]]).exists()
    assert not IdempotencyKey.objects.filter(tenant=alice.tenant).exists()
    assert set(Job.objects.filter(tenant=alice.tenant).values_list("status", flat=True)) == {
        JobStatus.RUNNING,
        JobStatus.QUEUED,
    }

    # The period's usage reads the same, now and by its day, and the recount
    # (which reads the ledger) leaves the period alone.
    # Storage is the one figure that moved: the expired audio left the bucket.
    before["storage_bytes"]["used"] = 0
    assert usage(alice) == before
    assert usage(alice, today) == before
    assert sweep().reconciled == 0
    assert usage(alice) == before


def test_a_past_period_is_read_from_its_totals(alice: Persona, engine: Engine) -> None:
    workload(alice, engine)
    # The same totals, as a period of more than a year ago whose jobs are all gone.
    then = timezone.now() - timedelta(days=400)
    starts_at, ends_at = billing_period(tenant_anchor(alice.tenant), then)
    UsagePeriod.objects.filter(tenant=alice.tenant).update(starts_at=starts_at, ends_at=ends_at)
    Job.objects.filter(tenant=alice.tenant).filter(status__in=FINISHED).delete()
    day = then.date().isoformat()

    body = usage(alice, day)

    assert body["jobs"] == {
        "pending": 0,
        "queued": 0,
        "running": 0,
        "succeeded": 4,
        "failed": 2,
        "cancelled": 1,
    }
    assert body["characters"]["used"] == 10 + 11 + 12 + 13
    assert body["audio_seconds"] > 0
    # A period with no usage at all reads as zeros, and no row is made for it.
    empty = usage(alice, "2020-01-15")
    assert empty["characters"]["used"] == 0
    assert empty["jobs"]["succeeded"] == 0
    assert UsagePeriod.objects.filter(tenant=alice.tenant).count() == 2  # old and current


@pytest.mark.parametrize("period", ["last month", "2026-13-01", "2999-01-01"])
def test_a_bad_period_is_refused(alice: Persona, period: str) -> None:
    answer = alice.client.get("/v1/usage", {"period": period})

    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_request"
    assert answer.json()["error"]["details"]["fields"]["period"] == [period]


def test_a_pass_is_bounded_in_rows_and_queries(alice: Persona, engine: Engine) -> None:
    for n in range(5):
        job = job_create(
            tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text=f"cancel {n}")
        )
        job_cancel(tenant=alice.tenant, job=job)
        past(job, days=500)
    horizon = prune_horizon()

    with CaptureQueriesContext(connection) as queries:
        assert jobs_prune_batch(before=horizon, batch=2) == 2
    # One read of ids (LIMIT off the index), one statement per foreign key to a
    # job (the ledger's and the Idempotency-Keys' at least), one DELETE of the
    # jobs, whatever the backlog; the savepoint statements are the transaction's.
    statements = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    relations = job_relations()  # a job's own two (long-form parent, reused from) count twice
    assert {LedgerEntry, IdempotencyKey} <= {relation.related_model for relation in relations}
    assert len(statements) == 1 + len(relations) + 1, statements
    assert "LIMIT 2" in statements[0]
    assert "FOR UPDATE SKIP LOCKED" in statements[0]
    assert statements[-1].startswith('DELETE FROM "synthesis_job"')

    # A pass whose time budget is spent stops after the batch it started.
    assert jobs_prune(batch=2, budget=timedelta(0)) == 2
    assert jobs_prune(batch=2) == 1
    assert jobs_prune() == 0
    assert not Job.objects.filter(tenant=alice.tenant).exists()


def test_the_prunable_index_serves_the_pass(alice: Persona) -> None:
    """The read of a batch is the index's range, not a scan of the table."""
    due = Job.objects.filter(finished_at__lt=prune_horizon())
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        plan = due.filter(PRUNABLE).order_by("finished_at")[:1000].explain()
    assert "job_prunable" in plan, plan
