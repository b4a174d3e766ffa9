"""A voice's consent: required where the plan says so (refused before anything is
stored), kept with the voice, and kept after the voice is deleted (its tombstone)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile

from audit.models import AuditEvent, EventType
from synthesis.models import Voice, VoiceConsent
from tenants.models import Plan
from tests.assertions import assert_error
from tests.audio_files import audio_file
from tests.conftest import Persona, make_persona
from tests.synthesis.test_api_voices import stored_files, upload

pytestmark = pytest.mark.embedded

CONSENT = {
    "speaker_name": "Alice Liddell",
    "method": "signed_form",
    "given_at": "2026-03-01T10:00:00Z",
}


@pytest.fixture
def carol(plan: Plan) -> Persona:
    """A tenant whose plan requires consent for every voice."""
    strict = Plan.objects.create(name="strict", voice_slots=10, require_voice_consent=True)
    return make_persona("carol", strict)


def upload_with_consent(persona: Persona, consent: Any, **files: bytes) -> Any:
    data: dict[str, Any] = {
        "name": "Narrator",
        "audio": SimpleUploadedFile("reference.wav", audio_file(4.0), "audio/wav"),
        "consent": consent if isinstance(consent, str) else json.dumps(consent),
    }
    for name, content in files.items():
        data[name] = SimpleUploadedFile(f"{name}.wav", content, "audio/wav")
    return persona.client.post("/v1/voices", data, format="multipart")


def test_a_plan_that_requires_consent_refuses_a_voice_without_it_and_stores_nothing(
    carol: Persona,
) -> None:
    response = upload(carol, audio_file(4.0))

    error = assert_error(response, 400, "voice_consent_required")
    assert error["details"]["field"] == "consent"
    assert not Voice.objects.exists()
    assert not VoiceConsent.objects.exists()
    assert stored_files(carol) == []
    assert not AuditEvent.objects.filter(type=EventType.VOICE_CREATED).exists()


def test_a_plan_without_the_requirement_takes_a_voice_without_consent(alice: Persona) -> None:
    assert upload(alice, audio_file(4.0)).status_code == 201
    assert not VoiceConsent.objects.exists()


@pytest.mark.parametrize(
    "consent",
    [
        "not json",
        "[1, 2]",
        {**CONSENT, "method": "a nod"},
        {**CONSENT, "given_at": "last tuesday"},
        {**CONSENT, "given_at": "2026-03-01T10:00:00"},  # no offset
        {**CONSENT, "given_at": "2999-01-01T00:00:00Z"},  # in the future
        {**CONSENT, "speaker_name": "  "},
        {k: v for k, v in CONSENT.items() if k != "speaker_name"},
        {**CONSENT, "witness": "Bob"},
    ],
)
def test_a_malformed_consent_is_refused_and_stores_nothing(carol: Persona, consent: Any) -> None:
    response = upload_with_consent(carol, consent)

    assert_error(response, 400, "invalid_consent")
    assert not Voice.objects.exists()
    assert stored_files(carol) == []


def test_evidence_without_consent_is_refused(alice: Persona) -> None:
    data = {
        "name": "Narrator",
        "audio": SimpleUploadedFile("reference.wav", audio_file(4.0), "audio/wav"),
        "consent_evidence": SimpleUploadedFile("e.wav", audio_file(2.0), "audio/wav"),
    }
    response = alice.client.post("/v1/voices", data, format="multipart")

    assert_error(response, 400, "invalid_consent")
    assert stored_files(alice) == []


def test_evidence_that_is_not_audio_is_refused_and_stores_nothing(carol: Persona) -> None:
    response = upload_with_consent(carol, CONSENT, consent_evidence=b"a scanned form, not audio")

    assert_error(response, 415, "unsupported_audio")
    assert not Voice.objects.exists()
    assert stored_files(carol) == []


def test_consent_is_stored_with_the_voice_and_its_evidence_privately_in_the_bucket(
    carol: Persona,
) -> None:
    evidence = audio_file(2.0, 8000)
    response = upload_with_consent(
        carol, {**CONSENT, "method": "recorded_statement"}, consent_evidence=evidence
    )

    assert response.status_code == 201, response.content
    voice = Voice.objects.get(pk=response.json()["id"])
    consent = VoiceConsent.objects.get(voice=voice)
    assert consent.speaker_name == "Alice Liddell"
    assert consent.method == "recorded_statement"
    assert consent.given_at.isoformat() == "2026-03-01T10:00:00+00:00"
    assert consent.voice_name == "Narrator"
    bucket = Path(settings.STORAGE["local_root"]) / carol.tenant.bucket
    assert (bucket / consent.evidence_key).read_bytes() == evidence
    assert "consent" not in response.json()  # not echoed; nor is the evidence linked anywhere
    [event] = AuditEvent.objects.filter(type=EventType.VOICE_CREATED)
    assert event.data["consent"]["speaker_name"] == "Alice Liddell"
    assert event.data["consent"]["evidence"] is True


def test_deleting_the_voice_keeps_its_consent_and_evidence_as_a_tombstone(
    carol: Persona, django_capture_on_commit_callbacks: Any
) -> None:
    voice_id = upload_with_consent(carol, CONSENT, consent_evidence=audio_file(2.0, 8000)).json()[
        "id"
    ]

    with django_capture_on_commit_callbacks(execute=True):  # the objects go after commit
        response = carol.client.delete(f"/v1/voices/{voice_id}")

    assert response.status_code == 204
    assert not Voice.objects.filter(pk=voice_id).exists()
    tombstone = VoiceConsent.objects.get(voice_uuid=voice_id)
    assert tombstone.voice is None
    assert tombstone.voice_deleted_at is not None
    assert tombstone.voice_name == "Narrator"
    assert tombstone.speaker_name == "Alice Liddell"
    # The voice's audio is gone; the consent evidence stays.
    bucket = Path(settings.STORAGE["local_root"]) / carol.tenant.bucket
    assert [p.relative_to(bucket).as_posix() for p in stored_files(carol)] == [
        f"consent/{voice_id}/evidence.wav"
    ]


def test_the_admin_shows_a_voices_consent(carol: Persona, admin_client: Any) -> None:
    voice_id = upload_with_consent(carol, CONSENT).json()["id"]

    page = admin_client.get(f"/admin/synthesis/voice/{voice_id}/change/")
    listing = admin_client.get("/admin/synthesis/voiceconsent/")

    assert page.status_code == 200
    assert b"Alice Liddell" in page.content
    assert b"Alice Liddell" in listing.content
