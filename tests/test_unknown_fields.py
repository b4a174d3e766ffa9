"""The native API refuses fields it does not take; the OpenAI-compatible route ignores them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from asgiref.sync import async_to_sync
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import AsyncClient

from synthesis.api import openai as openai_endpoint
from synthesis.api import streaming as relay_module
from synthesis.api.streaming import Chunk, Done, Event
from synthesis.models import Job, Voice
from synthesis.streaming import to_s16le
from tests.assertions import assert_error
from tests.audio_files import audio_file
from tests.conftest import Persona


def test_a_misspelt_speech_field_answers_400_naming_it(alice: Persona) -> None:
    response = alice.client.post("/v1/speech", {"text": "hi", "fromat": "mp3"}, format="json")

    error = assert_error(response, 400, "unknown_field")
    assert error["details"] == {"fields": ["fromat"]}
    assert "fromat" in error["message"]
    assert not Job.objects.exists()


def test_every_unknown_speech_field_is_named_at_once(alice: Persona) -> None:
    body = {"text": "hi", "voice": "alloy", "fromat": "mp3", "format": "wav"}

    response = alice.client.post("/v1/speech", body, format="json")

    assert assert_error(response, 400, "unknown_field")["details"] == {
        "fields": ["fromat", "voice"]
    }


def test_an_unknown_voice_upload_field_answers_400_naming_it(alice: Persona) -> None:
    data = {
        "name": "Narrator",
        "langauge": "en",
        "audio": SimpleUploadedFile("reference.wav", audio_file(4.0), "audio/wav"),
    }

    response = alice.client.post("/v1/voices", data, format="multipart")

    assert assert_error(response, 400, "unknown_field")["details"] == {"fields": ["langauge"]}
    assert not Voice.objects.exists()


def test_the_known_fields_alone_are_still_accepted(alice: Persona) -> None:
    speech = alice.client.post("/v1/speech", {"text": "hi", "format": "mp3"}, format="json")
    voice = alice.client.post(
        "/v1/voices",
        {"name": "Narrator", "audio": SimpleUploadedFile("reference.wav", audio_file(4.0))},
        format="multipart",
    )

    assert speech.status_code == 202, speech.content
    assert speech.json()["format"] == "mp3"
    assert voice.status_code == 201, voice.content


class _NoRedis:
    """Stands for Redis where the events are made up (`worker_stream`)."""


async def _no_redis() -> _NoRedis:
    return _NoRedis()


@pytest.fixture
def worker_stream(monkeypatch: pytest.MonkeyPatch, broker: Any) -> None:
    pcm = to_s16le(np.linspace(-0.3, 0.3, 2400, dtype=np.float32))

    async def stream_events(*, job: Any, client: Any) -> AsyncIterator[Event]:
        for event in (Chunk(pcm, 24000), Done()):
            yield event

    monkeypatch.setattr(openai_endpoint, "stream_events", stream_events)
    monkeypatch.setattr(openai_endpoint, "stream_client", _no_redis)
    monkeypatch.setattr(relay_module, "stream_client", _no_redis)


def test_the_openai_route_ignores_fields_it_does_not_know(
    alice: Persona, worker_stream: None
) -> None:
    """OpenAI's clients send fields Chorus has no use for; refusing them would
    break the clients this route exists for."""
    body = {
        "model": "tts-1",
        "input": "Hello there.",
        "voice": "alloy",
        "response_format": "wav",
        "user": "someone@example.com",
        "fromat": "mp3",
    }

    async def post() -> tuple[Any, bytes]:
        response = await AsyncClient().post(
            "/v1/audio/speech",
            json.dumps(body),
            content_type="application/json",
            headers={"Authorization": f"Bearer {alice.key}"},
        )
        return response, b"".join([piece async for piece in response.streaming_content])

    response, audio = async_to_sync(post)()

    assert response.status_code == 200, audio
    assert audio.startswith(b"RIFF")
    assert response["Content-Type"] == "audio/wav"
    assert Job.objects.get().format == "wav"
