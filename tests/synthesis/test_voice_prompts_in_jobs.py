"""Voice prompts as jobs use them: prepared once per voice version, kept in the
worker's memory, persisted next to the voice, never shared across tenants, and
removed with the voice. Output formats are chosen at submit and refused there."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import soundfile as sf
from django.conf import settings

from synthesis.engines.base import Engine
from synthesis.models import Job, Voice
from synthesis.services.execution import job_execute
from synthesis.services.jobs import job_create
from synthesis.services.voices import voice_create, voice_delete, voice_prompt_key
from synthesis.speech_request import SpeechRequest
from synthesis.voice_cache import VoicePromptCache
from tests.assertions import assert_error
from tests.audio_files import audio_file
from tests.conftest import Persona

pytestmark = pytest.mark.django_db

REFERENCE = audio_file(4.0, 24000)


def voice_of(persona: Persona) -> Voice:
    return voice_create(tenant=persona.tenant, name="narrator", audio=REFERENCE)


def run(persona: Persona, voice: Voice, engine: Engine, cache: VoicePromptCache) -> Job:
    job = job_create(
        tenant=persona.tenant,
        api_key=None,
        speech=SpeechRequest(text="Hello there.", voice_id=voice.id),
    )
    assert job_execute(job_id=job.id, engine=engine, worker="w", prompts=cache)["status"] == (
        "succeeded"
    )
    job.refresh_from_db()
    return job


def stored(persona: Persona, key: str) -> Path:
    return Path(settings.STORAGE["local_root"]) / persona.tenant.bucket / key


def test_a_prompt_is_computed_once_then_served_from_memory(alice: Persona, engine: Engine) -> None:
    voice, cache = voice_of(alice), VoicePromptCache()

    first, second = run(alice, voice, engine, cache), run(alice, voice, engine, cache)

    assert (first.prompt_source, second.prompt_source) == ("computed", "memory")
    assert first.prompt_seconds is not None
    assert stored(
        alice, voice_prompt_key(voice_id=voice.id, version=1, engine="synthetic")
    ).is_file()


def test_a_restarted_worker_loads_the_stored_prompt_instead_of_computing_it(
    alice: Persona, engine: Engine
) -> None:
    voice = voice_of(alice)
    run(alice, voice, engine, VoicePromptCache())

    after_restart = run(alice, voice, engine, VoicePromptCache())  # a fresh process's cache

    assert after_restart.prompt_source == "storage"


def test_a_new_voice_version_is_prepared_again(alice: Persona, engine: Engine) -> None:
    voice, cache = voice_of(alice), VoicePromptCache()
    run(alice, voice, engine, cache)
    Voice.objects.filter(pk=voice.pk).update(version=2)

    assert run(alice, Voice.objects.get(pk=voice.pk), engine, cache).prompt_source == "computed"


def test_two_tenants_with_identical_audio_never_share_a_prompt(
    alice: Persona, bob: Persona, engine: Engine
) -> None:
    cache = VoicePromptCache()
    run(alice, voice_of(alice), engine, cache)

    bobs = run(bob, voice_of(bob), engine, cache)

    assert bobs.prompt_source == "computed"
    assert len(cache) == 2


def test_deleting_a_voice_deletes_its_prepared_prompt(
    alice: Persona, engine: Engine, django_capture_on_commit_callbacks: object
) -> None:
    voice = voice_of(alice)
    run(alice, voice, engine, VoicePromptCache())
    prompt = stored(alice, voice_prompt_key(voice_id=voice.id, version=1, engine="synthetic"))
    assert prompt.is_file()

    with django_capture_on_commit_callbacks(execute=True):  # type: ignore[operator]
        voice_delete(tenant=alice.tenant, voice=voice)

    assert not prompt.exists()


@pytest.mark.parametrize(
    ("audio_format", "rate", "expected_rate"),
    [("flac", 16000, 16000), ("mp3", 44100, 44100), ("opus", None, 48000), ("wav", None, 24000)],
)
def test_a_job_is_stored_in_the_format_and_rate_it_asked_for(
    alice: Persona, engine: Engine, audio_format: str, rate: int | None, expected_rate: int
) -> None:
    job = job_create(
        tenant=alice.tenant,
        api_key=None,
        speech=SpeechRequest(text="Hello there.", format=audio_format, sample_rate=rate),
    )
    job_execute(job_id=job.id, engine=engine, worker="w")
    job.refresh_from_db()

    info = sf.info(io.BytesIO(stored(alice, job.output_key).read_bytes()))
    assert job.output_key.endswith({"opus": ".opus"}.get(audio_format, f".{audio_format}"))
    assert (job.sample_rate, info.samplerate) == (expected_rate, expected_rate)
    assert info.duration == pytest.approx(job.duration_s, rel=0.01)


def test_an_unsupported_format_and_rate_is_refused_at_submit(alice: Persona) -> None:
    response = alice.client.post(
        "/v1/speech", {"text": "Hi.", "format": "opus", "sample_rate": 22050}, format="json"
    )

    error = assert_error(response, 422, "unsupported_output")
    assert 22050 not in error["details"]["allowed_sample_rates"]
    assert not Job.objects.exists()
