"""POST /v1/audio/speech: OpenAI's parameters mapped onto a streamed Chorus job.

The worker's stream is faked here (the relay is tested in test_streaming.py);
tests/e2e/test_streaming.py drives this endpoint with the real `openai` package
against uvicorn and a real worker.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient

from synthesis.api import openai as endpoint
from synthesis.api import streaming as relay_module
from synthesis.api.streaming import Chunk, Done, Event, Failed
from synthesis.audio_out import to_s16le, wav_stream_header
from synthesis.models import Job, Voice
from tests.assertions import assert_error
from tests.conftest import Persona

RATE = 24000
PCM = to_s16le(np.linspace(-0.3, 0.3, 2400, dtype=np.float32))
BODY = {"model": "tts-1", "input": "Hello there.", "voice": "alloy", "response_format": "wav"}


class FakeClient:
    """Stands for Redis where the events are made up (`worker_stream`)."""


async def fake_client() -> FakeClient:
    return FakeClient()


@pytest.fixture
def worker_stream(monkeypatch: pytest.MonkeyPatch, broker: Any) -> list[Event]:
    """What the fake worker will stream; a test may replace the events."""
    events: list[Event] = [Chunk(PCM, RATE), Chunk(PCM, RATE), Done()]

    async def stream_events(*, job: Any, client: Any) -> AsyncIterator[Event]:
        for event in events:
            yield event

    monkeypatch.setattr(endpoint, "stream_events", stream_events)
    monkeypatch.setattr(endpoint, "stream_client", fake_client)
    monkeypatch.setattr(relay_module, "stream_client", fake_client)
    return events


def call(key: str | None, body: Any, method: str = "post") -> tuple[Any, bytes]:
    async def run() -> tuple[Any, bytes]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        client = AsyncClient()
        if method == "get":
            response = await client.get("/v1/audio/speech", headers=headers)
        else:
            response = await client.post(
                "/v1/audio/speech",
                json.dumps(body),
                content_type="application/json",
                headers=headers,
            )
        if response.streaming:
            return response, b"".join([p async for p in response.streaming_content])
        return response, response.content

    return async_to_sync(run)()


def make_voice(persona: Persona, name: str) -> Voice:
    return Voice.objects.create(
        tenant=persona.tenant,
        name=name,
        audio_key=f"voices/{uuid.uuid4()}.wav",
        audio_format="wav",
        sample_rate=24000,
        channels=1,
        duration_s=4.0,
        size_bytes=1000,
    )


def test_it_answers_with_the_audio_of_a_streamed_job(
    alice: Persona, worker_stream: list[Event], settings: Any
) -> None:
    settings.ENGINE = "synthetic"  # an engine that follows instructions
    response, body = call(alice.key, {**BODY, "speed": 1.5, "instructions": "Whisper."})

    assert response.status_code == 200
    assert response["Content-Type"] == "audio/wav"
    assert body == wav_stream_header(RATE) + PCM + PCM
    job = Job.objects.get(pk=response["X-Job-Id"])
    assert job.stream is True
    assert job.text == "Hello there."
    assert job.format == "wav"
    assert job.speed == 1.5
    assert job.instruction == "Whisper."
    assert job.voice is None  # "alloy": the engine's default voice
    assert job.tenant == alice.tenant
    assert "X-RateLimit-Remaining" in response


def test_mp3_is_the_default_format(alice: Persona, worker_stream: list[Event]) -> None:
    body = {k: v for k, v in BODY.items() if k != "response_format"}
    worker_stream[:] = [Failed("engine_error", "stop here")]
    response, _ = call(alice.key, body)
    assert Job.objects.get().format == "mp3"
    assert_error(response, 500, "engine_error")


@pytest.mark.parametrize("how", ["name", "NAME", "id", "object"])
def test_a_voice_is_found_by_id_or_name(
    alice: Persona, worker_stream: list[Event], how: str
) -> None:
    voice = make_voice(alice, "Narrator")
    given: Any = {
        "name": "Narrator",
        "NAME": "narrator",
        "id": str(voice.id),
        "object": {"id": str(voice.id)},
    }[how]
    response, _ = call(alice.key, {**BODY, "voice": given})
    assert response.status_code == 200
    assert Job.objects.get().voice == voice


def test_a_tenants_voice_named_like_an_openai_voice_wins(
    alice: Persona, worker_stream: list[Event]
) -> None:
    voice = make_voice(alice, "alloy")
    call(alice.key, BODY)
    assert Job.objects.get().voice == voice


def test_an_unknown_voice_is_not_found(alice: Persona, worker_stream: list[Event]) -> None:
    response, _ = call(alice.key, {**BODY, "voice": "nobody"})
    assert_error(response, 404, "not_found")
    assert not Job.objects.exists()


def test_another_tenants_voice_is_not_found(
    alice: Persona, bob: Persona, worker_stream: list[Event]
) -> None:
    voice = make_voice(alice, "Narrator")
    for given in (str(voice.id), "Narrator"):
        response, _ = call(bob.key, {**BODY, "voice": given})
        assert_error(response, 404, "not_found")
    assert not Job.objects.exists()


def test_aac_is_refused_as_the_native_route_refuses_a_format_naming_the_formats(
    alice: Persona, worker_stream: list[Event]
) -> None:
    response, _ = call(alice.key, {**BODY, "response_format": "aac"})
    error = assert_error(response, 400, "invalid_request")
    assert error["details"]["field"] == "response_format"
    assert error["details"]["allowed"] == ["mp3", "opus", "flac", "wav", "pcm"]
    assert "mp3, opus, flac, wav, pcm" in error["message"]
    assert not Job.objects.exists()


def test_an_unknown_priority_is_refused_naming_the_priorities(
    alice: Persona, worker_stream: list[Event]
) -> None:
    response, _ = call(alice.key, {**BODY, "priority": "urgent"})
    error = assert_error(response, 400, "invalid_request")
    assert error["details"]["field"] == "priority"
    assert error["details"]["allowed"] == ["high", "normal", "low"]
    assert "high, normal, low" in error["message"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("speed", 3.0), ("speed", 0.25), ("response_format", "ogg"), ("stream_format", "ws")],
)
def test_invalid_parameters_are_refused(
    alice: Persona, worker_stream: list[Event], field: str, value: Any
) -> None:
    response, _ = call(alice.key, {**BODY, field: value})
    error = assert_error(response, 400, "invalid_request")
    assert field in error["details"]["fields"]


def test_model_and_input_are_required(alice: Persona, worker_stream: list[Event]) -> None:
    response, _ = call(alice.key, {"voice": "alloy"})
    error = assert_error(response, 400, "invalid_request")
    assert set(error["details"]["fields"]) == {"model", "input"}


def test_text_over_the_plans_limit_is_refused_before_any_job(
    alice: Persona, worker_stream: list[Event]
) -> None:
    alice.tenant.plan.max_text_chars = 5
    alice.tenant.plan.save()
    response, _ = call(alice.key, BODY)
    assert_error(response, 422, "text_too_long")
    assert not Job.objects.exists()


def test_a_priority_outside_the_plan_is_refused(alice: Persona, worker_stream: list[Event]) -> None:
    alice.tenant.plan.allowed_priorities = ["low"]
    alice.tenant.plan.save()
    response, _ = call(alice.key, {**BODY, "priority": "normal"})
    assert_error(response, 403, "priority_not_allowed")


def test_it_needs_a_key_with_the_speech_scope(alice: Persona, worker_stream: list[Event]) -> None:
    response, _ = call(None, BODY)
    assert_error(response, 401, "unauthenticated")
    assert response["WWW-Authenticate"] == 'Bearer realm="chorus"'
    response, _ = call("ck_not_a_real_key", BODY)
    assert_error(response, 401, "invalid_api_key")

    alice.api_key.scopes = ["read"]
    alice.api_key.save()
    response, _ = call(alice.key, BODY)
    assert_error(response, 403, "insufficient_scope")


def test_it_counts_against_the_rate_limit(alice: Persona, worker_stream: list[Event]) -> None:
    alice.tenant.plan.requests_per_minute = 1
    alice.tenant.plan.save()
    assert call(alice.key, BODY)[0].status_code == 200
    response, _ = call(alice.key, BODY)
    assert_error(response, 429, "rate_limited")
    assert response["Retry-After"]


def test_a_job_that_fails_before_any_audio_is_a_json_error(
    alice: Persona, worker_stream: list[Event]
) -> None:
    worker_stream[:] = [Failed("engine_error", "The voice was deleted.")]
    response, _ = call(alice.key, BODY)
    error = assert_error(response, 500, "engine_error")
    assert error["details"]["job_id"] == str(Job.objects.get().id)


def test_sse_uses_openais_event_shapes(alice: Persona, worker_stream: list[Event]) -> None:
    response, body = call(alice.key, {**BODY, "response_format": "pcm", "stream_format": "sse"})
    assert response["Content-Type"] == "text/event-stream"
    events = [json.loads(b[len("data: ") :]) for b in body.decode().split("\n\n") if b]
    assert [e["type"] for e in events] == ["speech.audio.delta"] * 2 + ["speech.audio.done"]
    assert events[-1]["job_id"] == response["X-Job-Id"]


def test_only_post_is_allowed(alice: Persona) -> None:
    response, _ = call(alice.key, None, method="get")
    assert_error(response, 405, "method_not_allowed")


@pytest.mark.parametrize("given", ["a\u0000b", {"id": "x\u0000"}, "v" * 201])
def test_a_voice_that_cannot_be_a_name_is_refused(
    alice: Persona, worker_stream: list[Event], given: Any
) -> None:
    response, _ = call(alice.key, {**BODY, "voice": given})
    assert_error(response, 400, "invalid_request")
    assert not Job.objects.exists()
