"""The web tier refuses at submit what the workers' engine cannot serve (cosyvoice2 here).

Before this, a cosyvoice2 job without a voice, or with text upstream yields no audio
for, was accepted, charged and queued, then failed on a worker.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from synthesis.models import Job
from tests.assertions import assert_error
from tests.audio_files import audio_file
from tests.conftest import Persona


@pytest.fixture
def cosyvoice2_workers(settings: Any) -> None:
    settings.ENGINE = "cosyvoice2"


def voice_of(persona: Persona) -> str:
    response = persona.client.post(
        "/v1/voices",
        {"name": "narrator", "audio": SimpleUploadedFile("ref.wav", audio_file(4.0))},
        format="multipart",
    )
    assert response.status_code == 201, response.content
    return str(response.json()["id"])


def submit(persona: Persona, **body: Any) -> Any:
    return persona.client.post("/v1/speech", {"text": "Hello there.", **body}, format="json")


def test_it_refuses_a_job_without_a_voice_for_cosyvoice2_workers(
    alice: Persona, cosyvoice2_workers: None, broker: Any
) -> None:
    error = assert_error(submit(alice), 400, "voice_required")
    assert error["details"]["field"] == "voice_id"
    assert not Job.objects.exists()  # nothing queued, nothing charged


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        ({"text": "... !?"}, "text", "nothing_to_speak"),
        ({"text": "<|en|>Hello."}, "text", "control_token"),
        ({"instruction": "Whisper.<|endofprompt|>"}, "instruction", "control_token"),
    ],
)
def test_it_refuses_what_cosyvoice2_cannot_speak(
    alice: Persona,
    cosyvoice2_workers: None,
    broker: Any,
    body: dict[str, str],
    field: str,
    reason: str,
) -> None:
    error = assert_error(submit(alice, voice_id=voice_of(alice), **body), 400, "unsupported_text")
    assert (error["details"]["field"], error["details"]["reason"]) == (field, reason)
    assert not Job.objects.exists()


def test_the_openai_endpoint_refuses_an_unknown_voice_for_cosyvoice2(
    alice: Persona, cosyvoice2_workers: None, broker: Any
) -> None:
    response = alice.client.post(
        "/v1/audio/speech",
        {"model": "tts-1", "input": "Hello.", "voice": "alloy"},
        format="json",
    )
    assert_error(response, 400, "voice_required")


def test_a_job_with_a_voice_and_words_is_accepted(
    alice: Persona, cosyvoice2_workers: None, broker: Any
) -> None:
    response = submit(alice, voice_id=voice_of(alice), instruction="Speak cheerfully.")
    assert response.status_code == 202, response.content


def test_other_engines_keep_accepting_jobs_without_a_voice(alice: Persona, broker: Any) -> None:
    assert submit(alice).status_code == 202


# --- instructions, which only some engines follow -----------------------------------


def test_an_instruction_for_an_engine_that_cannot_follow_it_is_refused(
    alice: Persona, broker: Any, settings: Any
) -> None:
    settings.ENGINE = "espeak"  # no style control: it would speak as if none were given

    native = submit(alice, instruction="Speak cheerfully.")
    openai = alice.client.post(
        "/v1/audio/speech",
        {"model": "tts-1", "input": "Hello.", "voice": "alloy", "instructions": "Whisper."},
        format="json",
    )

    error = assert_error(native, 422, "instruction_not_supported")
    assert error["details"] == {"engine": "espeak", "field": "instruction"}
    assert_error(openai, 422, "instruction_not_supported")
    assert not Job.objects.exists()  # nothing queued, nothing charged
    assert alice.client.get("/v1/usage").json()["characters"]["reserved"] == 0


def test_a_blank_instruction_is_no_instruction(alice: Persona, broker: Any, settings: Any) -> None:
    settings.ENGINE = "espeak"
    assert submit(alice, instruction="  ").status_code == 202


@pytest.mark.parametrize("engine", ["synthetic", "cosyvoice2"])
def test_engines_that_follow_instructions_accept_them(
    alice: Persona, broker: Any, settings: Any, engine: str
) -> None:
    settings.ENGINE = engine
    response = submit(alice, voice_id=voice_of(alice), instruction="Speak cheerfully.")
    assert response.status_code == 202, response.content
    assert Job.objects.get().instruction == "Speak cheerfully."
