"""Usage counters (storage bytes, jobs and audio per period) against a full recount.

The services keep the counters as they change what they count; these tests run
a random workload through the same services (successes, engine failures,
cancels before and during a run, storage errors retried, workers lost and
requeued or given up, voices created and deleted, audio expired) and compare
every counter with a count over the rows themselves.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.db.models import Sum
from django.utils import timezone

from chorus.errors import StorageError
from quotas.counters import period_recount, storage_recount
from quotas.models import StorageUsage, UsagePeriod
from quotas.services import usage_period_current
from synthesis.engines.base import Engine
from synthesis.models import Job, JobStatus, Voice
from synthesis.services.execution import MAX_ATTEMPTS, job_claim, job_execute
from synthesis.services.jobs import job_cancel, job_create
from synthesis.services.recovery import job_requeue_lost
from synthesis.services.sweeper import sweep
from synthesis.services.voices import voice_create, voice_delete
from synthesis.speech_request import SpeechRequest
from synthesis.storage_runtime import get_storage
from tests.audio_files import audio_file
from tests.conftest import Persona
from tests.fake_engines import FailingEngine

pytestmark = pytest.mark.embedded


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> list[uuid.UUID]:
    """Jobs handed to the broker, recorded instead of sent."""
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


@pytest.fixture(autouse=True)
def _reconcile_at_every_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every sweep recounts (in production a tenant's counters once an hour)."""
    monkeypatch.setattr("quotas.counters.RECONCILE_INTERVAL", timedelta(0))


class _FailingPuts:
    """The tenant's bucket, unreachable for writes."""

    def __init__(self) -> None:
        self.inner = get_storage()

    def put(self, **kwargs: Any) -> None:
        raise StorageError("The bucket is unreachable.")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def full_count(persona: Persona) -> dict[str, Any]:
    """Usage counted over every row, as it was before the counters."""
    tenant = persona.tenant
    period = usage_period_current(tenant=tenant)
    jobs = Job.objects.filter(
        tenant=tenant, created_at__gte=period.starts_at, created_at__lt=period.ends_at
    )
    by_status = Counter(jobs.values_list("status", flat=True))
    voices = Voice.objects.filter(tenant=tenant).aggregate(n=Sum("size_bytes"))["n"] or 0
    outputs = (
        Job.objects.filter(
            tenant=tenant, status=JobStatus.SUCCEEDED, output_deleted_at__isnull=True
        ).aggregate(n=Sum("output_bytes"))["n"]
        or 0
    )
    audio = jobs.filter(status=JobStatus.SUCCEEDED).aggregate(s=Sum("duration_s"))["s"] or 0.0
    return {
        "jobs": {status: by_status[status] for status in JobStatus.values},
        "audio_seconds": round(audio, 3),
        "storage": voices + outputs,
    }


def counted(persona: Persona) -> dict[str, Any]:
    """Usage as the counters (and `GET /v1/usage`) give it."""
    body = persona.client.get("/v1/usage").json()
    return {
        "jobs": body["jobs"],
        "audio_seconds": body["audio_seconds"],
        "storage": body["storage_bytes"]["used"],
    }


def run_workload(
    personas: list[Persona],
    engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
    *,
    seed: int,
    steps: int,
) -> Counter[str]:
    rng = random.Random(seed)
    done: Counter[str] = Counter()
    voices: dict[str, list[Voice]] = {p.tenant.slug: [] for p in personas}
    for _ in range(steps):
        persona = rng.choice(personas)
        tenant = persona.tenant
        waiting = list(Job.objects.filter(tenant=tenant, status=JobStatus.QUEUED))
        action = rng.choice(
            ["submit"] * 4
            + ["succeed"] * 3
            + ["fail", "cancel", "cancel_running", "storage_down", "lost", "voice", "expire"]
            + ["sweep"]
        )
        if action == "submit" or (not waiting and action in {"succeed", "fail", "cancel"}):
            job_create(
                tenant=tenant,
                api_key=persona.api_key,
                speech=SpeechRequest(text="w" * rng.randint(1, 80)),
            )
            action = "submit"
        elif action in {"succeed", "fail", "cancel", "cancel_running", "storage_down", "lost"}:
            if not waiting:
                continue
            job = rng.choice(waiting)
            if action == "succeed":
                job_execute(job_id=job.id, engine=engine, worker="w1")
            elif action == "fail":
                job_execute(job_id=job.id, engine=FailingEngine(engine), worker="w1")  # type: ignore[arg-type]
            elif action == "cancel":
                job_cancel(tenant=tenant, job=job)
            elif action == "cancel_running":
                assert job_claim(job_id=job.id, worker="w1") is not None
                job_cancel(tenant=tenant, job=job)
            elif action == "storage_down":
                # Retried while attempts remain, then failed and refunded.
                with monkeypatch.context() as m:
                    m.setattr("synthesis.services.execution.get_storage", _FailingPuts)
                    # Down for good: the write is not waited for.
                    m.setattr("django.conf.settings.STORAGE_RETRY_WINDOW_S", 0)
                    job_execute(job_id=job.id, engine=engine, worker="w1")
            else:  # its worker died, once (requeued) or on every attempt (given up)
                for _ in range(rng.choice([1, MAX_ATTEMPTS])):
                    claim = job_claim(job_id=job.id, worker="w-dead")
                    if claim is not None:
                        job_requeue_lost(job=claim.job)
        elif action == "voice":
            mine = voices[tenant.slug]
            if mine and rng.random() < 0.5:
                voice_delete(tenant=tenant, voice=mine.pop(rng.randrange(len(mine))))
            else:
                seconds = rng.choice([3.5, 4.0, 5.0])
                mine.append(voice_create(tenant=tenant, name="v", audio=audio_file(seconds, 16000)))
        elif action == "expire":
            finished = Job.objects.filter(
                tenant=tenant, status=JobStatus.SUCCEEDED, output_deleted_at__isnull=True
            ).first()
            if finished is None:
                continue
            Job.objects.filter(pk=finished.pk).update(
                finished_at=timezone.now() - timedelta(days=400)
            )
        elif action == "sweep":
            # Nothing drifted: a pass in the middle of the workload corrects nothing.
            assert sweep().reconciled == 0
        done[action] += 1
    return done


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_counters_equal_a_full_recount_after_a_random_workload(
    alice: Persona,
    bob: Persona,
    engine: Engine,
    published: list[uuid.UUID],
    monkeypatch: pytest.MonkeyPatch,
    seed: int,
) -> None:
    done = run_workload([alice, bob], engine, monkeypatch, seed=seed, steps=120)
    sweep()  # expires what was aged, settles nothing new

    assert done["submit"] > 20, done
    assert done["succeed"] > 5, done
    for persona in (alice, bob):
        assert counted(persona) == full_count(persona), persona.tenant.slug
        period = usage_period_current(tenant=persona.tenant)
        settled = period_recount(period_id=period.pk)
        period.refresh_from_db()
        assert (
            period.jobs_succeeded,
            period.jobs_failed,
            period.jobs_cancelled,
            period.audio_ms,
        ) == (settled.jobs_succeeded, settled.jobs_failed, settled.jobs_cancelled, settled.audio_ms)
        assert StorageUsage.objects.get(tenant=persona.tenant).bytes_used == storage_recount(
            tenant_id=persona.tenant.pk
        )
    assert sweep().reconciled == 0


def test_the_workload_reaches_every_final_state(
    alice: Persona, engine: Engine, published: list[uuid.UUID], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_workload([alice], engine, monkeypatch, seed=7, steps=150)
    sweep()

    jobs = counted(alice)["jobs"]
    assert min(jobs["succeeded"], jobs["failed"], jobs["cancelled"]) > 0, jobs
    assert Job.objects.filter(tenant=alice.tenant, output_deleted_at__isnull=False).exists()
    assert Job.objects.filter(tenant=alice.tenant, attempts__gte=2).exists()
    assert Job.objects.filter(
        tenant=alice.tenant, error_code="worker_lost", attempts=MAX_ATTEMPTS
    ).exists()


def test_the_sweeper_corrects_counters_that_drifted(
    alice: Persona, engine: Engine, published: list[uuid.UUID]
) -> None:
    voice_create(tenant=alice.tenant, name="narrator", audio=audio_file(4.0, 16000))
    job = job_create(
        tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="Counted once.")
    )
    job_execute(job_id=job.id, engine=engine, worker="w1")
    truth = full_count(alice)
    # A row changed by hand, bypassing the services.
    StorageUsage.objects.filter(tenant=alice.tenant).update(bytes_used=7)
    UsagePeriod.objects.filter(tenant=alice.tenant).update(jobs_failed=5, audio_ms=1)

    assert sweep().reconciled == 2

    assert counted(alice) == truth
    assert sweep().reconciled == 0


def test_a_tenants_counters_are_recounted_once_an_hour(
    alice: Persona, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("quotas.counters.RECONCILE_INTERVAL", timedelta(hours=1))
    voice_create(tenant=alice.tenant, name="narrator", audio=audio_file(4.0, 16000))
    StorageUsage.objects.filter(tenant=alice.tenant).update(bytes_used=7)

    assert sweep().reconciled == 0  # opened (and so counted) a moment ago

    StorageUsage.objects.update(reconciled_at=timezone.now() - timedelta(hours=2))
    assert sweep().reconciled == 1
    assert sweep().reconciled == 0


def test_a_tenants_first_counter_starts_from_a_recount(alice: Persona, engine: Engine) -> None:
    voice = voice_create(tenant=alice.tenant, name="narrator", audio=audio_file(4.0, 16000))
    StorageUsage.objects.filter(tenant=alice.tenant).delete()  # as before the counters existed

    assert counted(alice)["storage"] == voice.size_bytes
    voice_delete(tenant=alice.tenant, voice=voice)
    assert counted(alice)["storage"] == 0


def test_a_voice_deleted_twice_frees_its_bytes_once(alice: Persona) -> None:
    kept = voice_create(tenant=alice.tenant, name="kept", audio=audio_file(4.0, 16000))
    gone = voice_create(tenant=alice.tenant, name="gone", audio=audio_file(3.5, 16000))
    stale = Voice.objects.get(pk=gone.pk)

    voice_delete(tenant=alice.tenant, voice=gone)
    voice_delete(tenant=alice.tenant, voice=stale)  # a second request that loaded it too

    assert counted(alice)["storage"] == kept.size_bytes


def test_an_outsiders_counters_are_their_own(
    alice: Persona, bob: Persona, engine: Engine, published: list[uuid.UUID]
) -> None:
    voice_create(tenant=alice.tenant, name="narrator", audio=audio_file(4.0, 16000))
    job = job_create(
        tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="Alice's audio.")
    )
    job_execute(job_id=job.id, engine=engine, worker="w1")

    assert counted(bob) == full_count(bob)
    assert counted(bob)["storage"] == 0
    assert set(counted(bob)["jobs"].values()) == {0}
