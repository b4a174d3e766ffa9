"""/v1/voices: uploading reference recordings, listing, reading and deleting them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile

from synthesis.models import Voice
from tests.assertions import assert_error
from tests.audio_files import audio_file, streamed_file
from tests.conftest import Persona


def upload(
    persona: Persona, audio: bytes | None, *, name: str | None = "Narrator", **fields: str
) -> Any:
    data: dict[str, Any] = dict(fields)
    if name is not None:
        data["name"] = name
    if audio is not None:
        data["audio"] = SimpleUploadedFile("reference.wav", audio, "audio/wav")
    return persona.client.post("/v1/voices", data, format="multipart")


def make_voice(persona: Persona, name: str = "Narrator") -> dict[str, Any]:
    response = upload(persona, audio_file(4.0), name=name)
    assert response.status_code == 201, response.content
    return response.json()


def stored_files(persona: Persona) -> list[Path]:
    bucket = Path(settings.STORAGE["local_root"]) / persona.tenant.bucket
    return sorted(p for p in bucket.rglob("*") if p.is_file())


# --- upload -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("container", "subtype", "expected_format"),
    [("WAV", None, "wav"), ("FLAC", None, "flac"), ("OGG", "VORBIS", "ogg")],
)
def test_it_accepts_a_real_recording_and_stores_it_in_the_tenants_bucket(
    alice: Persona, container: str, subtype: str | None, expected_format: str
) -> None:
    audio = audio_file(4.0, 24000, channels=2, format=container, subtype=subtype)

    response = upload(alice, audio, name="Narrator", transcript="Hello there.", language="en")

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["name"] == "Narrator"
    assert body["transcript"] == "Hello there."
    assert body["language"] == "en"
    assert body["version"] == 1
    assert body["audio_format"] == expected_format
    assert body["sample_rate"] == 24000
    assert body["channels"] == 2
    assert body["duration_s"] == pytest.approx(4.0, abs=0.01)
    assert body["size_bytes"] == len(audio)
    assert body["created_at"]
    assert "audio_key" not in body

    voice = Voice.objects.get(pk=body["id"])
    assert voice.tenant == alice.tenant
    path = Path(settings.STORAGE["local_root"]) / alice.tenant.bucket / voice.audio_key
    assert path.read_bytes() == audio
    assert path.suffix == f".{expected_format}"
    assert stored_files(alice) == [path]


def test_the_name_is_all_a_voice_needs_besides_audio(alice: Persona) -> None:
    body = make_voice(alice)

    assert body["transcript"] == ""
    assert body["language"] == ""


@pytest.mark.parametrize(
    ("audio", "status", "code"),
    [
        pytest.param(b"", 400, "empty_file", id="empty"),
        pytest.param(b"this is a text file, not audio\n" * 20, 415, "unsupported_audio", id="text"),
        pytest.param(audio_file(1.0), 422, "audio_too_short", id="too-short"),
        pytest.param(audio_file(31.5, 16000), 422, "audio_too_long", id="too-long"),
        pytest.param(audio_file(4.0, 8000), 422, "sample_rate_too_low", id="8-khz"),
        pytest.param(audio_file(4.0, 96000), 422, "sample_rate_too_high", id="96-khz"),
        pytest.param(audio_file(4.0, channels=3), 422, "too_many_channels", id="3-channels"),
    ],
)
def test_it_refuses_an_invalid_recording_and_leaves_nothing_behind(
    alice: Persona, audio: bytes, status: int, code: str
) -> None:
    response = upload(alice, audio)

    assert_error(response, status, code)
    assert not Voice.objects.exists()
    assert stored_files(alice) == []


def test_a_decompression_bomb_is_refused_by_its_header_before_it_is_decoded(
    alice: Persona,
) -> None:
    bomb = streamed_file(70, 384000, channels=2, format="FLAC", silent=True)  # about 116 KB

    response = upload(alice, bomb)

    error = assert_error(response, 422, "sample_rate_too_high")
    assert error["details"] == {"limit": 48000, "value": 384000}
    assert not Voice.objects.exists()
    assert stored_files(alice) == []


def test_a_truncated_compressed_recording_is_refused_as_unsupported(alice: Persona) -> None:
    audio = audio_file(4.0, format="FLAC")

    response = upload(alice, audio[: len(audio) // 3])

    assert_error(response, 415, "unsupported_audio")
    assert not Voice.objects.exists()
    assert stored_files(alice) == []


def test_a_truncated_wav_is_judged_by_the_audio_it_holds_not_its_header(alice: Persona) -> None:
    audio = audio_file(4.0)  # the header still says 4 s; a third of the samples remain

    response = upload(alice, audio[: len(audio) // 3])

    error = assert_error(response, 422, "audio_too_short")
    assert error["details"]["value_seconds"] == pytest.approx(4.0 / 3, abs=0.05)
    assert not Voice.objects.exists()
    assert stored_files(alice) == []


@pytest.mark.parametrize(
    ("name", "with_audio", "missing"),
    [(None, True, {"name"}), ("Narrator", False, {"audio"}), (None, False, {"name", "audio"})],
)
def test_it_names_each_missing_field(
    alice: Persona, name: str | None, with_audio: bool, missing: set[str]
) -> None:
    response = upload(alice, audio_file(4.0) if with_audio else None, name=name)

    error = assert_error(response, 400, "invalid_request")
    assert set(error["details"]["fields"]) == missing
    assert not Voice.objects.exists()
    assert stored_files(alice) == []


def test_it_refuses_a_name_longer_than_100_characters(alice: Persona) -> None:
    response = upload(alice, audio_file(4.0), name="n" * 101)

    error = assert_error(response, 400, "invalid_request")
    assert set(error["details"]["fields"]) == {"name"}
    assert not Voice.objects.exists()


def test_it_refuses_an_upload_declared_larger_than_the_plan_allows(alice: Persona) -> None:
    alice.tenant.plan.max_upload_bytes = 1000
    alice.tenant.plan.save()
    audio = audio_file(4.0)

    response = upload(alice, audio)

    error = assert_error(response, 413, "file_too_large")
    assert error["details"]["limit_bytes"] == 1000
    assert error["details"]["size_bytes"] > len(audio)
    assert not Voice.objects.exists()
    assert stored_files(alice) == []


def test_it_refuses_a_file_over_the_plan_limit_even_within_the_framing_allowance(
    alice: Persona,
) -> None:
    audio = audio_file(4.0)
    alice.tenant.plan.max_upload_bytes = len(audio) - 1
    alice.tenant.plan.save()

    response = upload(alice, audio)

    assert_error(response, 413, "file_too_large")
    assert not Voice.objects.exists()
    assert stored_files(alice) == []


def test_one_tenants_plan_limit_does_not_apply_to_another(alice: Persona, bob: Persona) -> None:
    from tenants.models import Plan

    bob.tenant.plan = Plan.objects.create(name="tiny", max_upload_bytes=1000)
    bob.tenant.save()

    assert upload(alice, audio_file(4.0)).status_code == 201
    assert upload(bob, audio_file(4.0)).status_code == 413


# --- list and read ----------------------------------------------------------------


def test_the_list_is_newest_first_and_paginated(alice: Persona) -> None:
    names = [f"voice {i}" for i in range(5)]
    for name in names:
        make_voice(alice, name)

    first = alice.client.get("/v1/voices", {"limit": 2}).json()
    rest = alice.client.get("/v1/voices", {"limit": 2, "offset": 2}).json()
    everything = alice.client.get("/v1/voices").json()

    assert first["count"] == 5
    assert [v["name"] for v in first["results"]] == ["voice 4", "voice 3"]
    assert [v["name"] for v in rest["results"]] == ["voice 2", "voice 1"]
    assert first["next"]
    assert first["previous"] is None
    assert [v["name"] for v in everything["results"]] == list(reversed(names))


def test_the_list_returns_at_most_100_voices_per_page(alice: Persona) -> None:
    Voice.objects.bulk_create(
        Voice(
            tenant=alice.tenant,
            name=f"voice {i}",
            audio_key=f"voices/{i}/v1/reference.wav",
            audio_format="wav",
            sample_rate=22050,
            channels=1,
            duration_s=4.0,
            size_bytes=1000,
        )
        for i in range(105)
    )

    body = alice.client.get("/v1/voices", {"limit": 1000}).json()
    default = alice.client.get("/v1/voices").json()

    assert body["count"] == 105
    assert len(body["results"]) == 100
    assert len(default["results"]) == 20


def test_it_reads_one_voice(alice: Persona) -> None:
    created = make_voice(alice)

    response = alice.client.get(f"/v1/voices/{created['id']}")

    assert response.status_code == 200
    assert response.json() == created


def test_an_unknown_voice_is_not_found(alice: Persona) -> None:
    response = alice.client.get("/v1/voices/00000000-0000-4000-8000-000000000000")

    assert_error(response, 404, "not_found")


# --- delete -----------------------------------------------------------------------


def test_deleting_a_voice_removes_it_and_its_recording(
    alice: Persona, django_capture_on_commit_callbacks: Any
) -> None:
    voice_id = make_voice(alice)["id"]
    [recording] = stored_files(alice)

    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.delete(f"/v1/voices/{voice_id}")

    assert response.status_code == 204
    assert response.content == b""
    assert_error(alice.client.get(f"/v1/voices/{voice_id}"), 404, "not_found")
    assert_error(alice.client.delete(f"/v1/voices/{voice_id}"), 404, "not_found")
    assert not recording.exists()
    assert not Voice.objects.filter(pk=voice_id).exists()


def test_the_recording_is_removed_only_once_the_deletion_commits(
    alice: Persona, django_capture_on_commit_callbacks: Any
) -> None:
    voice_id = make_voice(alice)["id"]
    [recording] = stored_files(alice)

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        alice.client.delete(f"/v1/voices/{voice_id}")

    assert recording.exists()
    assert len(callbacks) == 1


# --- the outsider -----------------------------------------------------------------


def test_another_tenant_can_neither_read_nor_delete_a_voice(
    alice: Persona, bob: Persona, django_capture_on_commit_callbacks: Any
) -> None:
    voice_id = make_voice(alice)["id"]
    [recording] = stored_files(alice)

    with django_capture_on_commit_callbacks(execute=True):
        read = bob.client.get(f"/v1/voices/{voice_id}")
        delete = bob.client.delete(f"/v1/voices/{voice_id}")

    assert_error(read, 404, "not_found")
    assert_error(delete, 404, "not_found")
    assert alice.client.get(f"/v1/voices/{voice_id}").status_code == 200
    assert recording.exists()


def test_the_list_shows_only_the_tenants_own_voices(alice: Persona, bob: Persona) -> None:
    alices = make_voice(alice, "alice's")
    bobs = make_voice(bob, "bob's")

    alice_list = alice.client.get("/v1/voices").json()
    bob_list = bob.client.get("/v1/voices").json()

    assert [v["id"] for v in alice_list["results"]] == [alices["id"]]
    assert [v["id"] for v in bob_list["results"]] == [bobs["id"]]
    assert alice_list["count"] == bob_list["count"] == 1


def test_an_upload_goes_to_the_uploaders_bucket_only(alice: Persona, bob: Persona) -> None:
    make_voice(bob)

    assert len(stored_files(bob)) == 1
    assert stored_files(alice) == []
