"""Result reuse: an identical request is answered from the tenant's earlier audio,
copied within its bucket, with no GPU work; each rule that keeps that correct.

Jobs run in this process with the synthetic engine (what a worker runs), and the
web tier is told the workers run `synthetic` too (CHORUS_ENGINE)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import transaction
from django.utils import timezone

from quotas.models import LedgerEntry, LedgerKind, UsagePeriod
from synthesis.engines.base import Engine
from synthesis.engines.synthetic import SyntheticEngine
from synthesis.models import Job, JobStatus, Voice
from synthesis.services.execution import job_execute
from synthesis.services.sweeper import sweep
from synthesis.storage_runtime import get_storage
from tests.audio_files import audio_file
from tests.conftest import Persona

pytestmark = [pytest.mark.embedded, pytest.mark.django_db(transaction=True)]

TEXT = "The same words, spoken once."


@pytest.fixture(autouse=True)
def _synthetic_workers(settings: Any) -> None:
    settings.ENGINE = "synthetic"


def _submit(persona: Persona, **body: Any) -> dict[str, Any]:
    response = persona.client.post("/v1/speech", {"text": TEXT, **body}, format="json")
    assert response.status_code == 202, response.json()
    return dict(response.json())


def _run(engine: Engine, job: dict[str, Any]) -> dict[str, Any]:
    row = Job.objects.get(pk=job["id"])
    job_execute(job_id=row.pk, engine=engine, worker="test-worker", epoch=row.epoch)
    row.refresh_from_db()
    assert row.status == JobStatus.SUCCEEDED
    return {"id": str(row.pk), "output_key": row.output_key}


def _bytes(persona: Persona, key: str) -> bytes:
    return get_storage().get(bucket=persona.tenant.bucket, key=key)


def _queued(broker: Any) -> int:
    return sum(broker.llen(q) for q in ("synth.high", "synth.normal", "synth.low"))


def test_an_identical_request_is_answered_from_the_earlier_audio_without_gpu_work(
    alice: Persona, broker: Any, engine: Engine
) -> None:
    first = _run(engine, _submit(alice))
    queued_before = _queued(broker)

    second = _submit(alice)

    assert second["status"] == "succeeded"
    assert second["audio_url"]
    assert _queued(broker) == queued_before  # nothing for a worker
    job = Job.objects.get(pk=second["id"])
    assert str(job.reused_from_id) == first["id"]
    assert job.output_key != first["output_key"]  # its own copy
    assert _bytes(alice, job.output_key) == _bytes(alice, first["output_key"])
    assert job.started_at is not None
    assert job.output_bytes == len(_bytes(alice, job.output_key))
    # Charged as a new job: reserved and committed, characters used.
    kinds = LedgerEntry.objects.filter(job=job).values_list("kind", flat=True)
    assert sorted(kinds) == sorted([LedgerKind.RESERVE, LedgerKind.COMMIT])
    period = UsagePeriod.objects.get(tenant=alice.tenant)
    assert period.characters_used == 2 * len(TEXT)
    assert period.characters_reserved == 0


def test_the_api_names_the_job_a_reused_one_was_answered_from(
    alice: Persona, engine: Engine, anonymous: Any
) -> None:
    first = _run(engine, _submit(alice))

    second = _submit(alice)

    assert second["reused_from"] == first["id"]
    assert alice.client.get(f"/v1/speech/{second['id']}").json()["reused_from"] == first["id"]
    assert alice.client.get(f"/v1/speech/{first['id']}").json()["reused_from"] is None
    listed = {
        row["id"]: row["reused_from"] for row in alice.client.get("/v1/speech").json()["results"]
    }
    assert listed == {first["id"]: None, second["id"]: first["id"]}
    schema = anonymous.get("/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    field = schema["components"]["schemas"]["JobOutput"]["properties"]["reused_from"]
    assert field["format"] == "uuid"
    assert field["nullable"] is True


@pytest.fixture
def copies_in_transaction(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """For each copy the storage makes, whether a transaction was open (and so
    perhaps the tenant's lock held) around it."""
    storage = get_storage()
    copy = storage.copy
    seen: list[bool] = []

    def watched_copy(**where: Any) -> None:
        seen.append(transaction.get_connection().in_atomic_block)
        copy(**where)

    monkeypatch.setattr(storage, "copy", watched_copy)
    return seen


def test_the_earlier_audio_is_copied_outside_any_transaction(
    alice: Persona, broker: Any, engine: Engine, copies_in_transaction: list[bool]
) -> None:
    """The probe runs under the tenant's lock (in the lock's round trip); the
    copy, network I/O on S3, must not: every submit of the tenant would wait."""
    _run(engine, _submit(alice))

    assert _submit(alice)["status"] == "succeeded"
    assert copies_in_transaction == [False]


def test_a_result_whose_audio_went_after_the_look_runs_the_job(
    alice: Persona, broker: Any, engine: Engine
) -> None:
    first = _run(engine, _submit(alice))
    # Gone from the bucket while its row still says kept (an expiry in progress).
    get_storage().delete(bucket=alice.tenant.bucket, key=first["output_key"])

    again = _submit(alice)

    assert again["status"] == "queued"
    job = Job.objects.get(pk=again["id"])
    assert job.reused_from_id is None
    assert LedgerEntry.objects.filter(job=job, kind=LedgerKind.RESERVE).count() == 1
    assert Job.objects.filter(tenant=alice.tenant).count() == 2  # nothing half-made


@pytest.mark.parametrize(
    "change",
    [
        {"text": TEXT + " Again."},
        {"speed": 1.2},
        {"format": "mp3"},
        {"sample_rate": 16000},
        {"instruction": "Whisper."},
    ],
)
def test_any_difference_in_what_is_asked_runs_the_job(
    alice: Persona, broker: Any, engine: Engine, change: dict[str, Any]
) -> None:
    _run(engine, _submit(alice))

    other = _submit(alice, **change)

    assert other["status"] == "queued"
    assert Job.objects.get(pk=other["id"]).reused_from_id is None


def test_another_tenants_identical_request_is_never_answered_from_it(
    alice: Persona, bob: Persona, broker: Any, engine: Engine
) -> None:
    _run(engine, _submit(alice))

    bobs = _submit(bob)

    assert bobs["status"] == "queued"
    assert (
        Job.objects.get(pk=bobs["id"]).reuse_key
        != Job.objects.filter(tenant=alice.tenant).values_list("reuse_key", flat=True).get()
    )


def test_a_new_recording_of_a_voice_never_gets_the_old_ones_audio(
    alice: Persona, broker: Any, engine: Engine
) -> None:
    upload = alice.client.post(
        "/v1/voices",
        {"name": "Narrator", "audio": SimpleUploadedFile("ref.wav", audio_file(4.0))},
        format="multipart",
    )
    voice_id = upload.json()["id"]
    _run(engine, _submit(alice, voice_id=voice_id))
    assert _submit(alice, voice_id=voice_id)["status"] == "succeeded"  # same version: reused

    Voice.objects.filter(pk=voice_id).update(version=2)  # what a re-upload changes

    assert _submit(alice, voice_id=voice_id)["status"] == "queued"


def test_a_sampling_engine_reuses_only_when_asked(
    alice: Persona, broker: Any, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cosyvoice2 needs a GPU and weights; the synthetic engine marked as sampling
    stands in for it (what reuse reads is the engine's `deterministic`)."""
    monkeypatch.setattr(SyntheticEngine, "deterministic", False)
    _run(engine, _submit(alice))

    assert _submit(alice)["status"] == "queued"
    assert _submit(alice, reuse=True)["status"] == "succeeded"


def test_reuse_false_always_runs_the_job(alice: Persona, broker: Any, engine: Engine) -> None:
    _run(engine, _submit(alice))

    assert _submit(alice, reuse=False)["status"] == "queued"


def test_reuse_can_be_turned_off_for_the_whole_service(
    alice: Persona, broker: Any, engine: Engine, settings: Any
) -> None:
    _run(engine, _submit(alice))
    settings.RESULT_REUSE = False

    assert _submit(alice)["status"] == "queued"


def test_expiring_the_original_keeps_the_reused_jobs_audio(
    alice: Persona, broker: Any, engine: Engine, live_server: Any, settings: Any
) -> None:
    settings.STORAGE = {**settings.STORAGE, "base_url": live_server.url}
    first = _run(engine, _submit(alice))
    second = _submit(alice)
    Job.objects.filter(pk=first["id"]).update(finished_at=timezone.now() - timedelta(days=400))

    sweep()

    assert Job.objects.get(pk=first["id"]).output_deleted_at is not None
    assert not get_storage().exists(bucket=alice.tenant.bucket, key=first["output_key"])
    link = alice.client.get(f"/v1/speech/{second['id']}").json()["audio_url"]
    downloaded = httpx.get(link, timeout=10)
    assert downloaded.status_code == 200
    assert downloaded.content[:4] == b"RIFF"
    # The next identical request is answered from the copy that is still kept.
    third = _submit(alice)
    assert third["status"] == "succeeded"
    assert str(Job.objects.get(pk=third["id"]).reused_from_id) == second["id"]


def test_after_every_copy_expired_the_job_runs_again(
    alice: Persona, broker: Any, engine: Engine
) -> None:
    _run(engine, _submit(alice))
    Job.objects.update(finished_at=timezone.now() - timedelta(days=400))
    sweep()

    assert _submit(alice)["status"] == "queued"


def test_a_reused_answer_refused_by_the_quota_leaves_no_object(
    alice: Persona, broker: Any, engine: Engine, settings: Any
) -> None:
    _run(engine, _submit(alice))
    alice.tenant.limit_overrides = {"monthly_characters": len(TEXT) + 1}
    alice.tenant.save()

    refused = alice.client.post("/v1/speech", {"text": TEXT}, format="json")

    assert refused.status_code == 429
    bucket = Path(settings.STORAGE["local_root"]) / alice.tenant.bucket / "speech"
    assert len(list(bucket.iterdir())) == 1  # the original only
    assert Job.objects.filter(tenant=alice.tenant).count() == 1


def test_the_same_idempotency_key_gives_the_same_reused_job(
    alice: Persona, broker: Any, engine: Engine
) -> None:
    _run(engine, _submit(alice))
    headers = {"HTTP_IDEMPOTENCY_KEY": "abc-1"}

    once = alice.client.post("/v1/speech", {"text": TEXT}, format="json", **headers)
    twice = alice.client.post("/v1/speech", {"text": TEXT}, format="json", **headers)

    assert once.json()["id"] == twice.json()["id"]
    assert once.json()["status"] == "succeeded"
    assert Job.objects.filter(tenant=alice.tenant).count() == 2


def _batch(persona: Persona, texts: list[str]) -> Any:
    items = [{"text": text} for text in texts]
    return persona.client.post("/v1/batches", {"items": items}, format="json")


def test_a_batchs_earlier_results_are_copied_before_its_transaction(
    alice: Persona, broker: Any, engine: Engine, copies_in_transaction: list[bool]
) -> None:
    """A batch holds the tenant's lock from its first item to its commit: the
    copies (network I/O on S3) are made before, never under it."""
    first = _run(engine, _submit(alice))

    response = _batch(alice, [TEXT, "Something new to say.", TEXT])

    assert response.status_code == 202, response.json()
    assert copies_in_transaction == [False, False]
    jobs = list(
        Job.objects.filter(batch_item__batch_id=response.json()["id"]).order_by("batch_item__index")
    )
    assert [job.status for job in jobs] == [
        JobStatus.SUCCEEDED,
        JobStatus.QUEUED,
        JobStatus.SUCCEEDED,
    ]
    reused = [jobs[0], jobs[2]]
    assert all(str(job.reused_from_id) == first["id"] for job in reused)
    assert len({first["output_key"], *(job.output_key for job in reused)}) == 3  # each its own
    for job in reused:
        assert _bytes(alice, job.output_key) == _bytes(alice, first["output_key"])
        kinds = LedgerEntry.objects.filter(job=job).values_list("kind", flat=True)
        assert sorted(kinds) == sorted([LedgerKind.RESERVE, LedgerKind.COMMIT])


def test_a_batch_refused_after_its_copies_leaves_none_of_them(
    alice: Persona, broker: Any, engine: Engine, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The month's characters run out between the copies and the batch's
    transaction (another submit took them): the batch is refused whole, and the
    objects copied for it are deleted."""
    _run(engine, _submit(alice))
    storage = get_storage()
    copy = storage.copy

    def copy_then_spend_the_month(**where: Any) -> None:
        copy(**where)
        UsagePeriod.objects.filter(tenant=alice.tenant).update(characters_used=10**9)

    monkeypatch.setattr(storage, "copy", copy_then_spend_the_month)

    refused = _batch(alice, [TEXT, "Something new to say."])

    assert refused.status_code == 429, refused.json()
    bucket = Path(settings.STORAGE["local_root"]) / alice.tenant.bucket / "speech"
    assert len(list(bucket.iterdir())) == 1  # the original only
    assert Job.objects.filter(tenant=alice.tenant).count() == 1
