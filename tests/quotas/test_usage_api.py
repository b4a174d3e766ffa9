"""GET /v1/usage, key scopes, and the cancel endpoint."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from quotas.models import LedgerEntry, LedgerKind
from quotas.services import usage_period_current
from synthesis.engines.base import Engine
from synthesis.models import Job, JobStatus, Voice
from synthesis.services.execution import job_execute
from synthesis.services.jobs import job_cancel, job_create
from synthesis.services.voices import voice_create
from synthesis.speech_request import SpeechRequest
from tenants.services import api_key_create
from tests.assertions import assert_error
from tests.audio_files import audio_file
from tests.conftest import Persona
from tests.fake_engines import FailingEngine


def submit(persona: Persona, text: str) -> Job:
    return job_create(
        tenant=persona.tenant, api_key=persona.api_key, speech=SpeechRequest(text=text)
    )


def client_with_scopes(persona: Persona, scopes: list[str]) -> APIClient:
    api_key, raw = api_key_create(tenant=persona.tenant, name="+".join(scopes) or "none")
    api_key.scopes = scopes
    api_key.save(update_fields=["scopes"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


@pytest.fixture
def alices_month(alice: Persona, engine: Engine) -> dict[str, Any]:
    """One job in every final state and one still queued, plus a voice."""
    voice = voice_create(tenant=alice.tenant, name="narrator", audio=audio_file(4.0, 24000))
    succeeded = submit(alice, "a" * 30)
    failed = submit(alice, "b" * 40)
    cancelled = submit(alice, "c" * 50)
    queued = submit(alice, "d" * 60)
    job_execute(job_id=succeeded.id, engine=engine, worker="w1")
    job_execute(job_id=failed.id, engine=FailingEngine(engine), worker="w1")  # type: ignore[arg-type]
    job_cancel(tenant=alice.tenant, job=cancelled)
    succeeded.refresh_from_db()
    return {"voice": voice, "succeeded": succeeded, "queued": queued}


# --- usage ------------------------------------------------------------------------


def test_usage_shows_the_periods_characters_jobs_audio_voices_and_storage(
    alice: Persona, alices_month: dict[str, Any]
) -> None:
    response = alice.client.get("/v1/usage")

    assert response.status_code == 200
    body = response.json()
    period = usage_period_current(tenant=alice.tenant)
    plan = alice.tenant.plan
    succeeded, voice = alices_month["succeeded"], alices_month["voice"]
    assert set(body) == {
        "period",
        "characters",
        "jobs",
        "audio_seconds",
        "voices",
        "storage_bytes",
    }
    assert body["period"] == {
        "starts_at": period.starts_at.isoformat().replace("+00:00", "Z"),
        "ends_at": period.ends_at.isoformat().replace("+00:00", "Z"),
    }
    assert body["characters"] == {
        "used": 30,
        "reserved": 60,
        "limit": plan.monthly_characters,
        "remaining": plan.monthly_characters - 90,
        "resets_at": body["period"]["ends_at"],
    }
    assert body["jobs"] == {
        "pending": 0,
        "queued": 1,
        "running": 0,
        "succeeded": 1,
        "failed": 1,
        "cancelled": 1,
    }
    assert body["audio_seconds"] == pytest.approx(succeeded.duration_s)
    assert body["voices"] == {"used": 1, "limit": plan.voice_slots}
    assert body["storage_bytes"] == {
        "used": voice.size_bytes + succeeded.output_bytes,
        "limit": plan.storage_bytes,
    }


def test_usage_counts_jobs_held_back_by_fair_admission_as_pending(
    alice: Persona, settings: Any
) -> None:
    settings.TENANT_BROKER_SLOTS = 2  # the production default
    for _ in range(5):
        submit(alice, "Held back.")

    jobs = alice.client.get("/v1/usage").json()["jobs"]

    assert (jobs["pending"], jobs["queued"]) == (3, 2)


def test_usage_remaining_never_goes_below_zero(alice: Persona) -> None:
    submit(alice, "x" * 100)
    alice.tenant.limit_overrides = {"monthly_characters": 40}
    alice.tenant.save(update_fields=["limit_overrides"])

    characters = alice.client.get("/v1/usage").json()["characters"]

    assert (characters["limit"], characters["reserved"], characters["remaining"]) == (40, 100, 0)


def test_an_outsiders_usage_does_not_include_alices(
    alice: Persona, bob: Persona, alices_month: dict[str, Any]
) -> None:
    body = bob.client.get("/v1/usage").json()

    assert body["characters"]["used"] == body["characters"]["reserved"] == 0
    assert set(body["jobs"].values()) == {0}
    assert body["audio_seconds"] == 0
    assert body["voices"]["used"] == 0
    assert body["storage_bytes"]["used"] == 0


def test_usage_needs_an_api_key(anonymous: APIClient) -> None:
    assert_error(anonymous.get("/v1/usage"), 401, "unauthenticated")


# --- scopes -----------------------------------------------------------------------


def test_a_key_without_read_cannot_read_anything(
    alice: Persona, alices_month: dict[str, Any]
) -> None:
    writer = client_with_scopes(alice, ["speech:write", "voices:write"])
    job, voice = alices_month["queued"], alices_month["voice"]

    for path in (
        "/v1/usage",
        "/v1/voices",
        f"/v1/voices/{voice.id}",
        "/v1/speech",
        f"/v1/speech/{job.id}",
    ):
        error = assert_error(writer.get(path), 403, "insufficient_scope")
        assert error["details"]["required"] == "read"

    # What it was made for still works.
    assert writer.post("/v1/speech", {"text": "Still allowed."}, format="json").status_code == 202


def test_a_read_only_key_cannot_submit_upload_delete_or_cancel(
    alice: Persona, alices_month: dict[str, Any]
) -> None:
    reader = client_with_scopes(alice, ["read"])
    job, voice = alices_month["queued"], alices_month["voice"]
    jobs_before = Job.objects.filter(tenant=alice.tenant).count()

    speech = reader.post("/v1/speech", {"text": "Not allowed."}, format="json")
    upload = reader.post(
        "/v1/voices", {"name": "v", "audio": audio_file(4.0, 24000)}, format="multipart"
    )
    delete = reader.delete(f"/v1/voices/{voice.id}")
    cancel = reader.post(f"/v1/speech/{job.id}/cancel")

    assert assert_error(speech, 403, "insufficient_scope")["details"]["required"] == "speech:write"
    assert assert_error(upload, 403, "insufficient_scope")["details"]["required"] == "voices:write"
    assert assert_error(delete, 403, "insufficient_scope")["details"]["required"] == "voices:write"
    assert assert_error(cancel, 403, "insufficient_scope")["details"]["required"] == "speech:write"
    assert Job.objects.filter(tenant=alice.tenant).count() == jobs_before
    assert Voice.objects.filter(pk=voice.pk).exists()
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED
    assert reader.get("/v1/usage").status_code == 200


def test_a_speech_only_key_cannot_touch_voices(
    alice: Persona, alices_month: dict[str, Any]
) -> None:
    speaker = client_with_scopes(alice, ["speech:write", "read"])

    response = speaker.delete(f"/v1/voices/{alices_month['voice'].id}")

    assert_error(response, 403, "insufficient_scope")
    assert Voice.objects.filter(pk=alices_month["voice"].pk).exists()


# --- cancel -----------------------------------------------------------------------


def test_cancelling_a_queued_job_refunds_its_characters(alice: Persona) -> None:
    job = submit(alice, "q" * 25)

    response = alice.client.post(f"/v1/speech/{job.id}/cancel")

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["id"], body["status"]) == (str(job.id), "cancelled")
    assert body["error"]["code"] == "cancelled"
    assert body["audio_url"] is None
    kinds = list(LedgerEntry.objects.filter(job=job).order_by("id").values_list("kind", flat=True))
    assert kinds == [LedgerKind.RESERVE, LedgerKind.REFUND]
    period = usage_period_current(tenant=alice.tenant)
    assert (period.characters_used, period.characters_reserved) == (0, 0)


@pytest.mark.parametrize("final", ["succeeded", "failed", "cancelled"])
def test_a_finished_job_cannot_be_cancelled(alice: Persona, engine: Engine, final: str) -> None:
    job = submit(alice, "f" * 25)
    if final == "succeeded":
        job_execute(job_id=job.id, engine=engine, worker="w1")
    elif final == "failed":
        job_execute(job_id=job.id, engine=FailingEngine(engine), worker="w1")  # type: ignore[arg-type]
    else:
        job_cancel(tenant=alice.tenant, job=job)
    ledger = list(LedgerEntry.objects.filter(job=job).values_list("kind", "characters"))

    response = alice.client.post(f"/v1/speech/{job.id}/cancel")

    error = assert_error(response, 409, "job_not_cancellable")
    assert error["details"] == {"status": final}
    assert list(LedgerEntry.objects.filter(job=job).values_list("kind", "characters")) == ledger
    job.refresh_from_db()
    assert job.status == final


def test_an_outsider_cannot_cancel_alices_job(alice: Persona, bob: Persona) -> None:
    job = submit(alice, "o" * 25)

    assert_error(bob.client.post(f"/v1/speech/{job.id}/cancel"), 404, "not_found")

    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED
    assert not LedgerEntry.objects.filter(job=job, kind=LedgerKind.REFUND).exists()
