from __future__ import annotations

import logging
import uuid

from django.db import transaction
from django.utils import timezone

from audit.models import EventType
from audit.services import audit_record
from quotas.counters import storage_add
from quotas.errors import StorageQuotaExceeded, VoiceSlotsFull
from quotas.plans import Limits, tenant_limits
from synthesis.audio import MAX_UPLOAD_SAMPLE_RATE, DecodedReference, decode_reference
from synthesis.consent import Consent, VoiceConsentRequired
from synthesis.engines import ENGINE_NAMES
from synthesis.models import Voice, VoiceConsent
from synthesis.selectors import storage_bytes_used
from synthesis.storage_runtime import get_storage
from tenants.locks import tenant_lock
from tenants.models import Tenant

log = logging.getLogger(__name__)

_EXTENSIONS = {"WAV": "wav", "FLAC": "flac", "OGG": "ogg", "MP3": "mp3"}


def voice_audio_key(*, voice_id: uuid.UUID, version: int, audio_format: str) -> str:
    ext = _EXTENSIONS.get(audio_format.upper(), "bin")
    return f"voices/{voice_id}/v{version}/reference.{ext}"


def voice_prompt_key(*, voice_id: uuid.UUID, version: int, engine: str) -> str:
    """Where an engine's prepared prompt for a voice version is kept, next to the voice."""
    return f"voices/{voice_id}/v{version}/prompt.{engine}.bin"


def voice_consent_evidence_key(*, voice_id: uuid.UUID, audio_format: str) -> str:
    """Apart from the voice's own objects: deleting the voice keeps it."""
    ext = _EXTENSIONS.get(audio_format.upper(), "bin")
    return f"consent/{voice_id}/evidence.{ext}"


# A consent statement: a phone line's rate will do, and it may run longer than a
# reference (decoding holds at most this many seconds).
EVIDENCE_MIN_SAMPLE_RATE = 8000
EVIDENCE_MAX_SECONDS = 120.0


def voice_create(
    *,
    tenant: Tenant,
    name: str,
    audio: bytes,
    transcript: str = "",
    language: str = "",
    consent: Consent | None = None,
) -> Voice:
    """Validate the recording by decoding it, store it, then record the voice.

    Nothing is written before validation passes. Slots and storage are checked
    under a lock on the tenant, so parallel uploads cannot overrun the plan; if
    the row cannot be written the stored objects are removed again, so a failed
    upload leaves nothing behind. A plan with `require_voice_consent` refuses a
    voice without `consent`, before anything else.
    """
    if consent is None and tenant.plan.require_voice_consent:
        raise VoiceConsentRequired(
            "Your plan requires the speaker's consent for every new voice: send the "
            "`consent` field (speaker_name, method, given_at).",
            details={"field": "consent"},
        )
    limits = tenant_limits(tenant)
    decoded = decode_reference(
        audio,
        max_bytes=limits.max_upload_bytes,
        min_seconds=limits.min_reference_seconds,
        max_seconds=limits.max_reference_seconds,
        max_sample_rate=MAX_UPLOAD_SAMPLE_RATE,
    )
    evidence = _decode_evidence(consent, limits=limits)
    voice_id = uuid.uuid4()
    key = voice_audio_key(voice_id=voice_id, version=1, audio_format=decoded.format)
    keys = [key]
    storage = get_storage()
    # Checked before the upload to the bucket (no object for a refused voice) and
    # again under the lock; the upload itself runs outside it, so a slow bucket
    # does not hold up the tenant's submissions.
    _check_room(tenant=tenant, limits=limits, size=len(audio))
    try:
        storage.put(
            bucket=tenant.bucket, key=key, data=audio, content_type="application/octet-stream"
        )
        evidence_key = ""
        if consent is not None and consent.evidence is not None and evidence is not None:
            evidence_key = voice_consent_evidence_key(
                voice_id=voice_id, audio_format=evidence.format
            )
            keys.append(evidence_key)
            storage.put(
                bucket=tenant.bucket,
                key=evidence_key,
                data=consent.evidence,
                content_type="application/octet-stream",
            )
        with transaction.atomic():
            tenant_lock(tenant.pk)
            _check_room(tenant=tenant, limits=limits, size=len(audio))
            voice = Voice.objects.create(
                id=voice_id,
                tenant=tenant,
                name=name,
                transcript=transcript,
                language=language,
                audio_key=key,
                audio_format=decoded.format.lower(),
                sample_rate=decoded.sample_rate,
                channels=decoded.channels,
                duration_s=round(decoded.duration_s, 3),
                size_bytes=len(audio),
            )
            storage_add(tenant_id=tenant.pk, delta=voice.size_bytes)
            record = None
            if consent is not None:
                record = VoiceConsent.objects.create(
                    tenant=tenant,
                    voice=voice,
                    voice_uuid=voice.id,
                    voice_name=voice.name,
                    voice_created_at=voice.created_at,
                    speaker_name=consent.speaker_name,
                    method=consent.method,
                    given_at=consent.given_at,
                    evidence_key=evidence_key,
                    evidence_size_bytes=len(consent.evidence or b""),
                )
            audit_record(
                type=EventType.VOICE_CREATED,
                tenant_id=tenant.pk,
                target=f"voice:{voice.id}",
                data={"name": voice.name, "consent": _consent_data(record)},
            )
            return voice
    except BaseException:
        _delete_objects_quietly(bucket=tenant.bucket, keys=keys)
        raise


def _decode_evidence(consent: Consent | None, *, limits: Limits) -> DecodedReference | None:
    """The evidence recording, checked as audio like a reference (its own bounds)."""
    if consent is None or consent.evidence is None:
        return None
    return decode_reference(
        consent.evidence,
        max_bytes=limits.max_upload_bytes,
        min_seconds=1.0,
        max_seconds=EVIDENCE_MAX_SECONDS,
        min_sample_rate=EVIDENCE_MIN_SAMPLE_RATE,
        max_sample_rate=MAX_UPLOAD_SAMPLE_RATE,
    )


def _consent_data(record: VoiceConsent | None) -> dict[str, object] | None:
    if record is None:
        return None
    return {
        "id": str(record.id),
        "speaker_name": record.speaker_name,
        "method": record.method,
        "given_at": record.given_at.isoformat(),
        "evidence": bool(record.evidence_key),
    }


def _check_room(*, tenant: Tenant, limits: Limits, size: int) -> None:
    voices = Voice.objects.filter(tenant=tenant).count()
    if voices >= limits.voice_slots:
        raise VoiceSlotsFull(
            f"You have {voices} voices; your plan keeps {limits.voice_slots}. "
            "Delete a voice to make room.",
            details={"limit": limits.voice_slots, "value": voices},
        )
    stored = storage_bytes_used(tenant=tenant)
    if stored + size > limits.storage_bytes:
        raise StorageQuotaExceeded(
            f"This upload needs {size} bytes but only {max(0, limits.storage_bytes - stored)} "
            "are left in your storage. Delete voices or wait for old audio to expire.",
            details={"limit": limits.storage_bytes, "value": stored, "requested": size},
        )


def voice_delete(*, tenant: Tenant, voice: Voice) -> None:
    """Delete the row, then its objects once the deletion has committed."""
    assert voice.tenant_id == tenant.pk
    bucket = tenant.bucket
    keys = [voice.audio_key] + [
        voice_prompt_key(voice_id=voice.id, version=version, engine=engine)
        for version in range(1, voice.version + 1)
        for engine in ENGINE_NAMES
    ]
    with transaction.atomic():
        # Its consent record stays, the voice's tombstone (the delete empties `voice`).
        VoiceConsent.objects.filter(voice_uuid=voice.pk).update(voice_deleted_at=timezone.now())
        deleted, _ = Voice.objects.filter(pk=voice.pk).delete()
        if deleted:  # not when a parallel request deleted it first
            storage_add(tenant_id=tenant.pk, delta=-voice.size_bytes)
            audit_record(
                type=EventType.VOICE_DELETED,
                tenant_id=tenant.pk,
                target=f"voice:{voice.id}",
                data={"name": voice.name, "created_at": voice.created_at.isoformat()},
            )
        transaction.on_commit(lambda: _delete_objects_quietly(bucket=bucket, keys=keys))


def _delete_objects_quietly(*, bucket: str, keys: list[str]) -> None:
    for key in keys:
        _delete_object_quietly(bucket=bucket, key=key)


def _delete_object_quietly(*, bucket: str, key: str) -> None:
    try:
        get_storage().delete(bucket=bucket, key=key)
    except Exception:  # the row is gone; a leftover object is logged, not fatal
        log.exception("could not delete %s/%s", bucket, key)
