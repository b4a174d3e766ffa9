"""C2PA Content Credentials: signed on the worker's write path, read back with
c2pa-python, broken by any change to the audio, and checked by the API."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import c2pa
import numpy as np
import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError

from synthesis.audio_out import encode_output
from synthesis.models import Job, JobStatus
from synthesis.provenance import (
    DIGITAL_SOURCE_TYPE,
    ProvenanceUnavailable,
    sidecar_key,
    sign_audio,
    tenant_hash,
    verify_audio,
)
from synthesis.provenance_keys import make_chain
from synthesis.services.execution import job_execute
from synthesis.services.jobs import job_create
from synthesis.speech_request import SpeechRequest
from synthesis.storage_runtime import get_storage
from tenants.models import validate_overrides
from tests.conftest import Persona

pytestmark = pytest.mark.embedded


@pytest.fixture
def signing(settings: Any, tmp_path: Path) -> tuple[Path, Path]:
    """A CA and a signing certificate made for this test, as the deployment's."""
    chain, key = make_chain(organization="Test Deployment")
    cert_path, key_path = tmp_path / "chain.pem", tmp_path / "key.pem"
    cert_path.write_bytes(chain)
    key_path.write_bytes(key)
    settings.C2PA_CERT, settings.C2PA_KEY = str(cert_path), str(key_path)
    return cert_path, key_path


def ten_seconds(audio_format: str) -> bytes:
    tone = 0.3 * np.sin(2 * np.pi * 220 * np.arange(240_000) / 24_000).astype(np.float32)
    return encode_output(tone, 24_000, format=audio_format, sample_rate=None).data


def sign(audio_format: str) -> Any:
    return sign_audio(
        data=ten_seconds(audio_format),
        audio_format=audio_format,
        job_id="3f1c2b8e-0000-4000-8000-000000000000",
        tenant_id=42,
        engine="synthetic",
    )


@pytest.mark.parametrize(
    ("audio_format", "mime"),
    [
        ("wav", "audio/wav"),
        ("mp3", "audio/mpeg"),
        ("flac", "audio/flac"),
    ],
)
def test_a_signed_file_shows_its_assertions_to_c2pa_python(
    signing: Any, audio_format: str, mime: str
) -> None:
    signed = sign(audio_format)
    assert signed.mode == "embedded"
    assert signed.sidecar is None
    with c2pa.Reader(mime, io.BytesIO(signed.data)) as reader:
        manifest = reader.get_active_manifest()
        codes = {s["code"] for s in reader.get_validation_results()["activeManifest"]["success"]}
    assertions = {a["label"]: a["data"] for a in manifest["assertions"]}
    (action,) = assertions["c2pa.actions.v2"]["actions"]
    assert action["action"] == "c2pa.created"
    assert action["digitalSourceType"] == DIGITAL_SOURCE_TYPE
    assert action["softwareAgent"]["name"] == "Chorus (synthetic)"
    assert assertions["org.chorus.job"] == {
        "job_id": "3f1c2b8e-0000-4000-8000-000000000000",
        "tenant_sha256": tenant_hash(42),
    }
    assert manifest["signature_info"]["issuer"] == "Test Deployment"
    assert {"claimSignature.validated", "assertion.dataHash.match"} <= codes
    # The audio itself still decodes: the manifest is a chunk players skip.
    import soundfile as sf

    samples, rate = sf.read(io.BytesIO(signed.data))
    assert rate == 24_000
    assert abs(len(samples) - 240_000) < 2_000


@pytest.mark.parametrize("audio_format", ["wav", "mp3", "flac"])
def test_a_file_altered_after_signing_fails_verification(signing: Any, audio_format: str) -> None:
    signed = sign(audio_format)
    assert verify_audio(data=signed.data).valid
    altered = bytearray(signed.data)
    altered[len(altered) // 2] ^= 0x01  # one bit of sound in the middle
    result = verify_audio(data=bytes(altered))
    assert result.manifest_present
    assert result.signature_valid
    assert not result.hash_valid
    assert not result.valid
    assert "assertion.dataHash.mismatch" in result.failures


@pytest.mark.parametrize("audio_format", ["opus", "pcm"])
def test_opus_and_pcm_get_a_sidecar_bound_to_every_byte(signing: Any, audio_format: str) -> None:
    signed = sign(audio_format)
    assert signed.mode == "sidecar"
    assert signed.data == ten_seconds_same(signed, audio_format)
    good = verify_audio(data=signed.data, sidecar=signed.sidecar)
    assert good.valid
    assert good.trusted
    assert good.claims["job_id"].startswith("3f1c2b8e")
    assert not verify_audio(data=signed.data + b"\0", sidecar=signed.sidecar).valid
    # Without its sidecar, the audio says nothing.
    assert not verify_audio(data=signed.data).manifest_present


def ten_seconds_same(signed: Any, audio_format: str) -> bytes:
    # pcm is deterministic; opus is not byte-stable across encodes, so compare lengths.
    return signed.data if audio_format == "opus" else ten_seconds(audio_format)


def test_a_file_signed_by_another_deployment_is_not_trusted(
    signing: Any, settings: Any, tmp_path: Path
) -> None:
    signed = sign("wav")
    other_chain, other_key = make_chain(organization="Elsewhere")
    (tmp_path / "other.pem").write_bytes(other_chain)
    (tmp_path / "other.key").write_bytes(other_key)
    settings.C2PA_CERT, settings.C2PA_KEY = str(tmp_path / "other.pem"), str(tmp_path / "other.key")
    result = verify_audio(data=signed.data)
    assert result.signature_valid
    assert result.hash_valid
    assert not result.trusted


def test_a_certificate_without_the_c2pa_key_usage_cannot_sign(
    settings: Any, tmp_path: Path
) -> None:
    chain, key = make_chain(eku=False)
    (tmp_path / "c.pem").write_bytes(chain)
    (tmp_path / "k.pem").write_bytes(key)
    settings.C2PA_CERT, settings.C2PA_KEY = str(tmp_path / "c.pem"), str(tmp_path / "k.pem")
    with pytest.raises(ProvenanceUnavailable):
        sign("wav")


def test_unsigned_audio_has_no_manifest(signing: Any) -> None:
    assert not verify_audio(data=ten_seconds("wav")).manifest_present
    assert not verify_audio(data=b"not audio at all").manifest_present


# --- the worker's write path ---------------------------------------------------------


def run_job(persona: Persona, engine: Any, audio_format: str) -> Job:
    job = job_create(
        tenant=persona.tenant,
        api_key=persona.api_key,
        speech=SpeechRequest(text="Hello there.", format=audio_format),
    )
    assert job_execute(job_id=job.id, engine=engine, worker="w1")["status"] == "succeeded"
    job.refresh_from_db()
    return job


def test_a_job_stores_a_signed_wav(signing: Any, alice: Persona, engine: Any) -> None:
    job = run_job(alice, engine, "wav")
    stored = get_storage().get(bucket=alice.tenant.bucket, key=job.output_key)
    result = verify_audio(data=stored)
    assert result.valid
    assert result.trusted
    assert result.embedded
    assert result.claims["job_id"] == str(job.id)
    assert result.claims["tenant_sha256"] == tenant_hash(alice.tenant.pk)
    assert result.claims["software_agent"] == f"Chorus ({engine.name})"
    assert job.provenance == "embedded"
    assert job.output_bytes == len(stored)
    answer = alice.client.get(f"/v1/speech/{job.id}").json()
    assert answer["provenance"] == {"embedded": True}
    assert job.text.encode() not in stored  # the text never goes into the manifest


def test_an_opus_job_stores_its_sidecar_and_links_it(
    signing: Any, alice: Persona, engine: Any
) -> None:
    job = run_job(alice, engine, "opus")
    storage = get_storage()
    audio = storage.get(bucket=alice.tenant.bucket, key=job.output_key)
    sidecar = storage.get(bucket=alice.tenant.bucket, key=sidecar_key(job.output_key))
    assert verify_audio(data=audio, sidecar=sidecar).valid
    answer = alice.client.get(f"/v1/speech/{job.id}").json()
    assert answer["provenance"]["embedded"] is False
    fetched = alice.client.get(
        answer["provenance"]["sidecar_url"].removeprefix("http://testserver")
    )
    assert fetched.status_code == 200
    assert b"".join(fetched.streaming_content) == sidecar


def test_a_job_fails_and_is_refunded_when_the_key_cannot_sign(
    settings: Any, tmp_path: Path, alice: Persona, engine: Any
) -> None:
    (tmp_path / "broken.pem").write_text("not a certificate")
    settings.C2PA_CERT = settings.C2PA_KEY = str(tmp_path / "broken.pem")
    job = job_create(tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="Hi."))
    assert (
        job_execute(job_id=job.id, engine=engine, worker="w1")["code"] == "provenance_unavailable"
    )
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.output_key == ""
    assert not list(Path(settings.STORAGE["local_root"]).rglob("*.wav"))


def test_a_tenant_may_go_unsigned_only_where_the_operator_allows_it(
    signing: Any, settings: Any, alice: Persona, engine: Any
) -> None:
    alice.tenant.limit_overrides = {"provenance": False}
    alice.tenant.save()
    assert run_job(alice, engine, "wav").provenance == "embedded"  # required by default
    settings.C2PA_REQUIRED = False
    job = run_job(alice, engine, "wav")
    assert job.provenance == ""
    assert not verify_audio(
        data=get_storage().get(bucket=alice.tenant.bucket, key=job.output_key)
    ).manifest_present
    assert alice.client.get(f"/v1/speech/{job.id}").json()["provenance"] is None


def test_the_provenance_override_is_a_boolean() -> None:
    validate_overrides({"provenance": False, "voice_slots": 3})
    with pytest.raises(ValidationError):
        validate_overrides({"provenance": "no"})


# --- POST /v1/provenance/verify and manage.py verify_provenance ------------------------


def test_alice_verifies_a_signed_file(signing: Any, alice: Persona) -> None:
    signed = sign("wav")
    answer = alice.client.post(
        "/v1/provenance/verify", {"file": io.BytesIO(signed.data)}, format="multipart"
    )
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["manifest_present"]
    assert body["valid"]
    assert body["trusted"]
    assert body["claims"]["actions"] == ["c2pa.created"]
    assert body["claims"]["digital_source_type"] == DIGITAL_SOURCE_TYPE
    assert body["claims"]["tenant_sha256"] == tenant_hash(42)


def test_an_altered_upload_is_answered_invalid(signing: Any, alice: Persona) -> None:
    altered = bytearray(sign("flac").data)
    altered[len(altered) // 2] ^= 0x01
    body = alice.client.post(
        "/v1/provenance/verify", {"file": io.BytesIO(bytes(altered))}, format="multipart"
    ).json()
    assert body["manifest_present"]
    assert not body["valid"]
    assert not body["hash_valid"]


def test_an_opus_file_is_verified_with_its_sidecar(signing: Any, alice: Persona) -> None:
    signed = sign("opus")
    body = alice.client.post(
        "/v1/provenance/verify",
        {"file": io.BytesIO(signed.data), "sidecar": io.BytesIO(signed.sidecar)},
        format="multipart",
    ).json()
    assert body["valid"]
    assert not body["embedded"]


def test_a_file_without_credentials_is_answered_with_nothing_claimed(
    signing: Any, alice: Persona
) -> None:
    plain = sign("wav").data  # a signed file's audio, with a sidecar that is not one
    answer = alice.client.post(
        "/v1/provenance/verify",
        {"file": io.BytesIO(plain), "sidecar": io.BytesIO(b"not a manifest")},
        format="multipart",
    )
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert not body["valid"]
    assert "claims" not in body


def test_verify_without_a_file_is_an_invalid_request(alice: Persona) -> None:
    answer = alice.client.post("/v1/provenance/verify", {}, format="multipart")
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_request"


def test_verify_of_an_empty_file_is_refused(alice: Persona) -> None:
    answer = alice.client.post(
        "/v1/provenance/verify", {"file": io.BytesIO(b"")}, format="multipart"
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "empty_file"


def test_verify_needs_an_api_key(anonymous: Any) -> None:
    answer = anonymous.post(
        "/v1/provenance/verify", {"file": io.BytesIO(b"RIFF")}, format="multipart"
    )
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "unauthenticated"


def test_bob_learns_only_what_the_file_itself_says(
    signing: Any, alice: Persona, bob: Persona, engine: Any
) -> None:
    """The outsider: verifying reads no stored object, so bob can check a file of
    alice's he was given, and sees a hash of her tenant id, never the id or text."""
    job = run_job(alice, engine, "wav")
    stored = get_storage().get(bucket=alice.tenant.bucket, key=job.output_key)
    body = bob.client.post(
        "/v1/provenance/verify", {"file": io.BytesIO(stored)}, format="multipart"
    ).json()
    assert body["valid"]
    assert body["claims"]["tenant_sha256"] == tenant_hash(alice.tenant.pk)
    text = json.dumps(body)
    assert job.text not in text
    assert f'"{alice.tenant.pk}"' not in text
    assert "alice" not in text


def test_the_command_verifies_a_file_and_its_sidecar(
    signing: Any, tmp_path: Path, capsys: Any
) -> None:
    signed = sign("pcm")
    (tmp_path / "a.pcm").write_bytes(signed.data)
    (tmp_path / "a.pcm.c2pa").write_bytes(signed.sidecar)
    call_command("verify_provenance", str(tmp_path / "a.pcm"))
    assert json.loads(capsys.readouterr().out)["valid"] is True
    (tmp_path / "a.pcm").write_bytes(signed.data[:-2])
    with pytest.raises(CommandError, match="do not hold"):
        call_command("verify_provenance", str(tmp_path / "a.pcm"))
