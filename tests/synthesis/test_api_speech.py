"""/v1/speech: submitting jobs onto the real queues, reading them, downloading results."""

from __future__ import annotations

import base64
import io
import json
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import soundfile as sf
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from kombu.exceptions import OperationalError
from rest_framework.test import APIClient

from chorus.redis_client import get_redis
from synthesis.engines.base import Engine
from synthesis.models import Job, JobStatus
from synthesis.services.execution import job_execute
from tenants.models import Plan
from tests.assertions import assert_error
from tests.audio_files import audio_file
from tests.conftest import Persona


def submit(persona: Persona, **body: Any) -> Any:
    return persona.client.post("/v1/speech", {"text": "Hello there.", **body}, format="json")


def make_job(persona: Persona, **body: Any) -> dict[str, Any]:
    response = submit(persona, **body)
    assert response.status_code == 202, response.content
    return response.json()


def make_voice(persona: Persona, name: str = "Narrator") -> dict[str, Any]:
    response = persona.client.post(
        "/v1/voices",
        {"name": name, "audio": SimpleUploadedFile("ref.wav", audio_file(4.0))},
        format="multipart",
    )
    assert response.status_code == 201, response.content
    return response.json()


def queued_messages(broker: redis.Redis, queue: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in broker.lrange(queue, 0, -1)]


def download(url: str) -> Any:
    return APIClient().get(url)


def body_of(response: Any) -> bytes:
    return b"".join(response.streaming_content)


# --- submitting -------------------------------------------------------------------


def test_submitting_answers_202_with_the_job_and_where_to_find_it(alice: Persona) -> None:
    response = submit(alice, text="Hello there.")

    assert response.status_code == 202
    body = response.json()
    assert body["status"] == "queued"
    assert body["created_at"]
    assert body["text"] == "Hello there."
    assert body["characters"] == len("Hello there.")
    assert (body["priority"], body["format"], body["speed"]) == ("normal", "wav", 1.0)
    assert body["voice_id"] is None
    assert body["audio_url"] is None
    assert body["error"] is None
    assert response["Location"] == f"/v1/speech/{body['id']}"
    assert alice.client.get(response["Location"]).json()["id"] == body["id"]
    job = Job.objects.get(pk=body["id"])
    assert (job.tenant, job.api_key) == (alice.tenant, alice.api_key)


@pytest.mark.parametrize("priority", ["high", "normal", "low"])
def test_a_job_is_published_on_its_prioritys_queue(
    alice: Persona, broker: redis.Redis, django_capture_on_commit_callbacks: Any, priority: str
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        job = make_job(alice, priority=priority)

    for queue in settings.SYNTH_QUEUES:
        assert broker.llen(queue) == (1 if queue == f"synth.{priority}" else 0), queue
    [message] = queued_messages(broker, f"synth.{priority}")
    assert message["headers"]["task"] == "synthesis.synthesize_job"
    assert message["properties"]["delivery_info"]["routing_key"] == f"synth.{priority}"
    args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
    # The message carries the publish epoch, so a stale message is recognised.
    assert (args, kwargs) == ([job["id"], 1], {})


def test_nothing_is_published_before_the_job_is_committed(
    alice: Persona, broker: redis.Redis, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        make_job(alice, priority="high")

    assert len(callbacks) == 1
    assert broker.llen("synth.high") == 0


def test_text_over_the_plans_limit_is_refused_and_no_job_is_made(alice: Persona) -> None:
    alice.tenant.plan.max_text_chars = 10
    alice.tenant.plan.save()

    response = submit(alice, text="x" * 11)

    error = assert_error(response, 422, "text_too_long")
    assert error["details"] == {"limit": 10, "value": 11}
    assert not Job.objects.exists()
    assert submit(alice, text="x" * 10).status_code == 202


def test_a_priority_outside_the_plan_is_refused(alice: Persona) -> None:
    alice.tenant.plan.allowed_priorities = ["normal", "low"]
    alice.tenant.plan.save()

    response = submit(alice, priority="high")

    error = assert_error(response, 403, "priority_not_allowed")
    assert error["details"] == {"allowed": ["normal", "low"], "value": "high"}
    assert not Job.objects.exists()


def test_an_unknown_voice_is_not_found(alice: Persona) -> None:
    response = submit(alice, voice_id=str(uuid.uuid4()))

    assert_error(response, 404, "not_found")
    assert not Job.objects.exists()


def test_another_tenants_voice_is_not_found(alice: Persona, bob: Persona) -> None:
    bobs_voice = make_voice(bob)

    response = submit(alice, voice_id=bobs_voice["id"])

    assert_error(response, 404, "not_found")
    assert not Job.objects.exists()


def test_a_job_with_an_own_voice_records_it(alice: Persona) -> None:
    voice = make_voice(alice)

    job = make_job(alice, voice_id=voice["id"])

    assert job["voice_id"] == voice["id"]


def test_a_body_that_is_not_json_is_refused(alice: Persona) -> None:
    response = alice.client.post(
        "/v1/speech", data='{"text": "unclosed', content_type="application/json"
    )

    assert_error(response, 400, "malformed_request")
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("format", "aac"),
        ("speed", 5),
        ("speed", 0.1),
        ("speed", "fast"),
        ("priority", "urgent"),
        ("text", ""),
        ("text", "   "),
        ("voice_id", "not-a-uuid"),
    ],
)
def test_an_invalid_field_is_refused_with_its_name(alice: Persona, field: str, value: Any) -> None:
    response = submit(alice, **{field: value})

    error = assert_error(response, 400, "invalid_request")
    assert set(error["details"]["fields"]) == {field}
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("format", "aac", ["wav", "mp3", "opus", "flac", "pcm"]),
        ("priority", "urgent", ["high", "normal", "low"]),
    ],
)
def test_a_value_outside_the_choices_is_refused_with_the_choices(
    alice: Persona, field: str, value: str, allowed: list[str]
) -> None:
    response = submit(alice, **{field: value})

    error = assert_error(response, 400, "invalid_request")
    assert error["details"]["field"] == field
    assert sorted(error["details"]["allowed"]) == sorted(allowed)
    assert all(choice in error["message"] for choice in allowed), error["message"]
    assert value in error["message"]
    assert set(error["details"]["fields"]) == {field}
    assert not Job.objects.exists()


def test_a_missing_text_is_refused(alice: Persona) -> None:
    response = alice.client.post("/v1/speech", {"priority": "low"}, format="json")

    error = assert_error(response, 400, "invalid_request")
    assert set(error["details"]["fields"]) == {"text"}


# --- reading ----------------------------------------------------------------------


def test_the_list_is_newest_first_and_paginated(alice: Persona) -> None:
    ids = [make_job(alice, text=f"job {i}")["id"] for i in range(5)]

    first = alice.client.get("/v1/speech", {"limit": 2}).json()
    rest = alice.client.get("/v1/speech", {"limit": 2, "offset": 2}).json()
    after = alice.client.get(first["next"]).json()

    assert [j["id"] for j in first["results"]] == [ids[4], ids[3]]
    assert [j["id"] for j in rest["results"]] == [ids[2], ids[1]]
    assert after["results"] == rest["results"]


def test_it_reads_one_job(alice: Persona) -> None:
    created = make_job(alice, text="Read me.", priority="low", speed=1.5)

    response = alice.client.get(f"/v1/speech/{created['id']}")

    assert response.status_code == 200
    body = response.json()
    assert body["id"] == created["id"]
    assert (body["text"], body["priority"], body["speed"]) == ("Read me.", "low", 1.5)
    assert body["timings"]["queued_at"]
    assert body["timings"]["started_at"] is None


def test_another_tenant_cannot_read_a_job(alice: Persona, bob: Persona) -> None:
    job = make_job(alice)

    assert_error(bob.client.get(f"/v1/speech/{job['id']}"), 404, "not_found")
    assert alice.client.get(f"/v1/speech/{job['id']}").status_code == 200


def test_the_list_shows_only_the_tenants_own_jobs(alice: Persona, bob: Persona) -> None:
    alices = make_job(alice)
    bobs = make_job(bob)

    alice_list = alice.client.get("/v1/speech").json()
    bob_list = bob.client.get("/v1/speech").json()

    assert [j["id"] for j in alice_list["results"]] == [alices["id"]]
    assert [j["id"] for j in bob_list["results"]] == [bobs["id"]]


# --- results ----------------------------------------------------------------------


def test_a_succeeded_job_links_to_its_audio(alice: Persona, engine: Engine) -> None:
    voice = make_voice(alice)
    job = make_job(alice, text="Hello from the synthetic engine.", voice_id=voice["id"])

    result = job_execute(job_id=job["id"], engine=engine, worker="test-worker")

    assert result == {"job_id": job["id"], "status": "succeeded"}
    body = alice.client.get(f"/v1/speech/{job['id']}").json()
    assert body["status"] == "succeeded"
    assert body["engine"] == "synthetic"
    assert body["error"] is None
    assert body["audio_url"].startswith("http://testserver/v1/files/")
    assert body["audio_url_expires_at"]
    assert body["timings"]["finished_at"]

    response = download(body["audio_url"])

    assert response.status_code == 200
    data = body_of(response)
    stored = Path(settings.STORAGE["local_root"]) / alice.tenant.bucket / f"speech/{job['id']}.wav"
    assert data == stored.read_bytes()
    assert len(data) == body["output_bytes"]
    samples, rate = sf.read(io.BytesIO(data))
    assert rate == body["sample_rate"] == engine.sample_rate
    assert len(samples) / rate == pytest.approx(body["duration_s"], abs=0.01)
    assert body["duration_s"] > 0
    assert response["Content-Disposition"].startswith("attachment")
    assert f"{job['id']}.wav" in response["Content-Disposition"]


def test_a_download_link_edited_to_another_bucket_or_key_is_not_found(
    alice: Persona, bob: Persona, engine: Engine
) -> None:
    job = make_job(alice)
    other = make_job(alice, text="Another one.")
    bobs = make_job(bob)
    for job_id in (job["id"], other["id"], bobs["id"]):
        job_execute(job_id=job_id, engine=engine, worker="test-worker")
    url = alice.client.get(f"/v1/speech/{job['id']}").json()["audio_url"]
    assert download(url).status_code == 200

    edits = [
        url.replace(f"/{alice.tenant.bucket}/", f"/{bob.tenant.bucket}/"),
        url.replace(job["id"], bobs["id"]).replace(alice.tenant.bucket, bob.tenant.bucket),
        url.replace(f"speech/{job['id']}", f"speech/{other['id']}"),
        url.replace("filename=", "filename=x"),
        url.replace("expires=", "expires=9"),
    ]
    for edited in edits:
        assert edited != url
        assert_error(download(edited), 404, "not_found")


def test_an_expired_download_link_is_gone(alice: Persona, engine: Engine) -> None:
    alice.tenant.plan.link_ttl_seconds = 1
    alice.tenant.plan.save()
    job = make_job(alice)
    job_execute(job_id=job["id"], engine=engine, worker="test-worker")
    url = alice.client.get(f"/v1/speech/{job['id']}").json()["audio_url"]

    time.sleep(1.1)

    assert_error(download(url), 410, "link_expired")


def test_a_failed_or_unfinished_job_has_no_link(alice: Persona) -> None:
    job = make_job(alice)
    Job.objects.filter(pk=job["id"]).update(status=JobStatus.FAILED, output_key="speech/x.wav")

    assert alice.client.get(f"/v1/speech/{job['id']}").json()["audio_url"] is None


def test_a_job_whose_voice_was_deleted_before_it_ran_fails_with_a_reason(
    alice: Persona, engine: Engine, django_capture_on_commit_callbacks: Any
) -> None:
    voice = make_voice(alice, "Grandpa")
    job = make_job(alice, voice_id=voice["id"])
    with django_capture_on_commit_callbacks(execute=True):
        assert alice.client.delete(f"/v1/voices/{voice['id']}").status_code == 204

    result = job_execute(job_id=job["id"], engine=engine, worker="test-worker")

    assert result["status"] == "failed"
    body = alice.client.get(f"/v1/speech/{job['id']}").json()
    assert body["status"] == "failed"
    assert body["voice_id"] is None
    assert body["audio_url"] is None
    assert body["error"]["code"] == "engine_error"
    assert "'Grandpa' was deleted" in body["error"]["message"]
    assert "Submit the job again" in body["error"]["message"]


# --- the broker is down -----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_job_that_cannot_be_queued_answers_503_and_is_failed(
    alice: Persona, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broker_down(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("Error 111 connecting to redis. Connection refused.")

    monkeypatch.setattr("synthesis.tasks.publish_task", broker_down)

    response = submit(alice)

    error = assert_error(response, 503, "queue_unavailable")
    assert response["Retry-After"] == "5"
    job = Job.objects.get(pk=error["details"]["job_id"])
    assert job.status == JobStatus.FAILED
    assert job.error_code == "queue_unavailable"
    assert job.finished_at is not None
    listed = alice.client.get("/v1/speech").json()["results"]
    assert [(j["id"], j["status"]) for j in listed] == [(str(job.pk), "failed")]


@pytest.fixture
def redis_down(settings: Any) -> Iterator[None]:
    """Redis, as this process reaches it, is a port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        settings.REDIS_URL = f"redis://127.0.0.1:{sock.getsockname()[1]}/0"
    get_redis.cache_clear()  # one client per process, made from the setting
    yield
    get_redis.cache_clear()


def test_a_stream_is_refused_before_anything_when_redis_is_down(
    alice: Persona, request: pytest.FixtureRequest
) -> None:
    request.getfixturevalue("redis_down")

    response = alice.client.post(
        "/v1/speech", {"text": "Hello there.", "stream": True}, format="json"
    )

    assert_error(response, 503, "queue_unavailable")
    assert response["Retry-After"] == "5"
    assert not Job.objects.exists()
    assert alice.client.get("/v1/usage").json()["characters"]["reserved"] == 0


@pytest.mark.django_db(transaction=True)
def test_a_job_is_queued_at_once_when_no_transaction_is_open(
    alice: Persona, broker: redis.Redis
) -> None:
    job = make_job(alice, priority="low")

    assert broker.llen("synth.low") == 1
    assert Job.objects.get(pk=job["id"]).status == JobStatus.QUEUED


def test_a_plan_with_other_limits_applies_only_to_its_tenants(alice: Persona, bob: Persona) -> None:
    bob.tenant.plan = Plan.objects.create(name="tiny", max_text_chars=5)
    bob.tenant.save()

    assert submit(alice, text="longer than five").status_code == 202
    assert submit(bob, text="longer than five").status_code == 422
