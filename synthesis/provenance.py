"""C2PA Content Credentials on stored audio (EU AI Act Art. 50(2)): signing on
the worker, after encoding and before the object is put, and verifying.

WAV, MP3 and FLAC carry the manifest inside the file. Opus (Ogg) and raw PCM
cannot: their manifest goes next to the audio as `<key>.c2pa`, a C2PA manifest
store whose hard binding is a hash of every byte of the audio object, so the
sidecar is tied to that object exactly.

The manifest says what made the audio (`c2pa.created`, digital source type
trainedAlgorithmicMedia, the software agent: Chorus and the engine) and which
job: the job id and a SHA-256 of the tenant id. Never the text, never a name.
"""

from __future__ import annotations

import hashlib
import io
import threading
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import c2pa
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from django.conf import settings

from chorus.errors import ChorusError
from synthesis.provenance_keys import (
    CERT_FILE,
    KEY_FILE,
    Credentials,
    ensure_self_signed,
    load_credentials,
)

DIGITAL_SOURCE_TYPE = "http://cv.iptc.org/newscodes/digitalsourcetype/trainedAlgorithmicMedia"
JOB_ASSERTION = "org.chorus.job"
SIDECAR_SUFFIX = ".c2pa"
SIDECAR_CONTENT_TYPE = "application/c2pa"
# Formats whose container holds a manifest, as c2pa names them.
EMBEDDED_FORMATS = {"wav": "audio/wav", "mp3": "audio/mpeg", "flac": "audio/flac"}
# A sidecar binds the bytes as they are, whatever they hold.
_OPAQUE = "application/octet-stream"
_HASH_MATCHES = (
    "assertion.dataHash.match",
    "assertion.boxesHash.match",
    "assertion.bmffHash.match",
)


class ProvenanceUnavailable(ChorusError):
    """The deployment's signing certificate or key cannot be used."""

    status = 500
    code = "provenance_unavailable"


@dataclass(frozen=True)
class SignedAudio:
    data: bytes  # the audio as stored (with its manifest where embedded)
    sidecar: bytes | None  # the manifest store for `<key>.c2pa`, where not embedded
    mode: str  # "embedded", "sidecar" or "" (unsigned)


@dataclass(frozen=True)
class Verification:
    manifest_present: bool
    embedded: bool = False
    signature_valid: bool = False
    hash_valid: bool = False
    trusted: bool = False
    validation_state: str = ""
    claims: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return self.manifest_present and self.signature_valid and self.hash_valid


def sidecar_key(key: str) -> str:
    return key + SIDECAR_SUFFIX


def has_sidecar(key: str) -> bool:
    """Whether audio stored at `key` may have a sidecar manifest (by its extension)."""
    return key.rsplit(".", 1)[-1] not in EMBEDDED_FORMATS


def tenant_hash(tenant_id: int | str) -> str:
    return hashlib.sha256(str(tenant_id).encode()).hexdigest()


def provenance_wanted(*, limit_overrides: dict[str, Any] | None) -> bool:
    """Whether a tenant's audio is signed: always while the operator requires it
    (CHORUS_C2PA_REQUIRED, the default); otherwise unless its overrides say
    {"provenance": false}."""
    if settings.C2PA_REQUIRED:
        return True
    return (limit_overrides or {}).get("provenance", True) is not False


def sign_audio(
    *, data: bytes, audio_format: str, job_id: str, tenant_id: int | str, engine: str
) -> SignedAudio:
    """The audio with its Content Credentials (or its sidecar manifest)."""
    builder = c2pa.Builder(
        _manifest(job_id=job_id, tenant_id=tenant_id, engine=engine, audio_format=audio_format)
    )
    embedded = audio_format in EMBEDDED_FORMATS
    if not embedded:
        builder.set_no_embed()
    signed = io.BytesIO()
    try:
        manifest = builder.sign(
            _signer(), EMBEDDED_FORMATS.get(audio_format, _OPAQUE), io.BytesIO(data), signed
        )
    except c2pa.C2paError as exc:
        raise ProvenanceUnavailable(f"signing the audio failed: {exc}") from exc
    finally:
        builder.close()
    if embedded:
        return SignedAudio(data=signed.getvalue(), sidecar=None, mode="embedded")
    # No embed: what the builder wrote is the audio unchanged; keep the original.
    return SignedAudio(data=data, sidecar=manifest, mode="sidecar")


def verify_audio(*, data: bytes, sidecar: bytes | None = None) -> Verification:
    """What a file's Content Credentials say and whether they hold for these bytes.
    The signature is checked against the deployment's own CA as the trust anchor."""
    mime = sniff_format(data) if sidecar is None else _OPAQUE
    if sidecar is None and mime is None:
        return Verification(manifest_present=False)
    context = c2pa.Context.from_dict(
        {
            "trust": {"trust_anchors": credentials().anchor_pem.decode()},
            "verify": {"verify_trust": True, "remote_manifest_fetch": False},
        }
    )
    try:
        reader = c2pa.Reader.try_create(mime or _OPAQUE, io.BytesIO(data), sidecar, context=context)
    except c2pa.C2paError as exc:  # a damaged manifest store: present, but nothing holds
        return Verification(manifest_present=True, failures=[f"unreadable: {exc}"])
    if reader is None:
        return Verification(manifest_present=False)
    with reader:
        results = reader.get_validation_results() or {}
        active = reader.get_active_manifest() or {}
        state = reader.get_validation_state() or ""
        embedded = sidecar is None and reader.is_embedded()
    statuses = results.get("activeManifest", {})
    succeeded = {item["code"] for item in statuses.get("success", [])}
    failures = [item["code"] for item in statuses.get("failure", [])]
    return Verification(
        manifest_present=True,
        embedded=embedded,
        signature_valid="claimSignature.validated" in succeeded
        and not any(
            code.startswith(("claimSignature.", "signingCredential.invalid")) for code in failures
        ),
        hash_valid=any(code in succeeded for code in _HASH_MATCHES)
        and not any("Hash.mismatch" in code for code in failures),
        trusted="signingCredential.trusted" in succeeded,
        validation_state=state,
        claims=_claims(active),
        failures=failures,
    )


def sniff_format(data: bytes) -> str | None:
    """The C2PA format of a file that can carry an embedded manifest, by its first bytes."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "audio/wav"
    if data[:4] == b"fLaC":
        return "audio/flac"
    if data[:3] == b"ID3" or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "audio/mpeg"
    return None


def _claims(manifest: dict[str, Any]) -> dict[str, Any]:
    assertions = {a.get("label"): a.get("data", {}) for a in manifest.get("assertions", [])}
    actions = (assertions.get("c2pa.actions.v2") or assertions.get("c2pa.actions") or {}).get(
        "actions", []
    )
    created: dict[str, Any] = next((a for a in actions if a.get("action") == "c2pa.created"), {})
    job = assertions.get(JOB_ASSERTION, {})
    agent = created.get("softwareAgent")
    return {
        "actions": [a.get("action") for a in actions],
        "digital_source_type": created.get("digitalSourceType"),
        "software_agent": agent.get("name") if isinstance(agent, dict) else agent,
        "job_id": job.get("job_id"),
        "tenant_sha256": job.get("tenant_sha256"),
        "issuer": manifest.get("signature_info", {}).get("issuer"),
    }


def _manifest(
    *, job_id: str, tenant_id: int | str, engine: str, audio_format: str
) -> dict[str, Any]:
    agent = f"Chorus ({engine})" if engine else "Chorus"
    return {
        "claim_generator_info": [{"name": "Chorus", "version": _version()}],
        "title": f"{job_id}.{audio_format}",
        "assertions": [
            {
                "label": "c2pa.actions.v2",
                "data": {
                    "actions": [
                        {
                            "action": "c2pa.created",
                            "digitalSourceType": DIGITAL_SOURCE_TYPE,
                            "softwareAgent": {"name": agent},
                        }
                    ]
                },
            },
            {
                "label": JOB_ASSERTION,
                "data": {"job_id": str(job_id), "tenant_sha256": tenant_hash(tenant_id)},
            },
        ],
    }


def _version() -> str:
    try:
        return version("chorus")
    except PackageNotFoundError:
        return "0"


# --- the deployment's credentials, loaded once per process -------------------------

_lock = threading.Lock()
_loaded: dict[tuple[str, str], tuple[Credentials, c2pa.Signer]] = {}


def credential_paths() -> tuple[Path, Path]:
    if settings.C2PA_CERT:
        return Path(settings.C2PA_CERT), Path(str(settings.C2PA_KEY))
    folder = Path(settings.C2PA_DEFAULT_DIR)
    return folder / CERT_FILE, folder / KEY_FILE


def ensure_credentials() -> bool:
    """Make the data folder's self-signed pair if no certificate is configured;
    True when it was made now (`make run` says so)."""
    if settings.C2PA_CERT:
        return False
    return ensure_self_signed(Path(settings.C2PA_DEFAULT_DIR))


def _load() -> tuple[Credentials, c2pa.Signer]:
    cert, key = credential_paths()
    with _lock:
        cached = _loaded.get((str(cert), str(key)))
        if cached is not None:
            return cached
        ensure_credentials()
        try:
            loaded = load_credentials(cert=cert, key=key)
            alg = c2pa.C2paSigningAlg.ES256 if _is_ec(loaded.key_pem) else c2pa.C2paSigningAlg.PS256
            signer = c2pa.Signer.from_info(
                c2pa.C2paSignerInfo(alg, loaded.chain_pem, loaded.key_pem, None)
            )
        except (OSError, ValueError, c2pa.C2paError) as exc:
            raise ProvenanceUnavailable(
                f"the C2PA signing certificate {cert} or key {key} cannot be used: {exc}"
            ) from exc
        _loaded.clear()
        _loaded[(str(cert), str(key))] = (loaded, signer)
        return loaded, signer


def _is_ec(key_pem: bytes) -> bool:
    # ES256 for an EC key (what `make run` makes); PS256 for an RSA one.
    return isinstance(load_pem_private_key(key_pem, password=None), ec.EllipticCurvePrivateKey)


def credentials() -> Credentials:
    return _load()[0]


def _signer() -> c2pa.Signer:
    return _load()[1]


def sign_job_output(
    *,
    data: bytes,
    audio_format: str,
    job_id: str,
    tenant_id: int,
    limit_overrides: Any,
    engine: str,
    segment: bool = False,
) -> SignedAudio:
    """A job's encoded audio as it is to be stored: signed unless the operator
    lets this tenant go without (`provenance_wanted`). A long text's segment is
    never handed out, and goes unsigned: the join signs the file that is (a
    segment's sidecar would outlive the audio the join deletes)."""
    if segment or not provenance_wanted(limit_overrides=limit_overrides):
        return SignedAudio(data=data, sidecar=None, mode="")
    return sign_audio(
        data=data, audio_format=audio_format, job_id=job_id, tenant_id=tenant_id, engine=engine
    )
