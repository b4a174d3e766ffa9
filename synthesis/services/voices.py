from __future__ import annotations

import logging
import uuid

from django.db import transaction

from synthesis.audio import decode_reference
from synthesis.models import Voice
from synthesis.storage_runtime import get_storage
from tenants.models import Tenant

log = logging.getLogger(__name__)

_EXTENSIONS = {"WAV": "wav", "FLAC": "flac", "OGG": "ogg", "MP3": "mp3"}


def voice_audio_key(*, voice_id: uuid.UUID, version: int, audio_format: str) -> str:
    ext = _EXTENSIONS.get(audio_format.upper(), "bin")
    return f"voices/{voice_id}/v{version}/reference.{ext}"


def voice_create(
    *, tenant: Tenant, name: str, audio: bytes, transcript: str = "", language: str = ""
) -> Voice:
    """Validate the recording by decoding it, store it, then record the voice.

    Nothing is written before validation passes; if the row cannot be written the
    stored object is removed again, so a failed upload leaves nothing behind.
    """
    plan = tenant.plan
    decoded = decode_reference(
        audio,
        max_bytes=plan.max_upload_bytes,
        min_seconds=plan.min_reference_seconds,
        max_seconds=plan.max_reference_seconds,
    )
    voice_id = uuid.uuid4()
    key = voice_audio_key(voice_id=voice_id, version=1, audio_format=decoded.format)
    storage = get_storage()
    storage.put(bucket=tenant.bucket, key=key, data=audio, content_type="application/octet-stream")
    try:
        with transaction.atomic():
            return Voice.objects.create(
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
    except BaseException:
        storage.delete(bucket=tenant.bucket, key=key)
        raise


def voice_delete(*, tenant: Tenant, voice: Voice) -> None:
    """Delete the row, then its objects once the deletion has committed."""
    assert voice.tenant_id == tenant.pk
    bucket, key = tenant.bucket, voice.audio_key
    with transaction.atomic():
        voice.delete()
        transaction.on_commit(lambda: _delete_object_quietly(bucket=bucket, key=key))


def _delete_object_quietly(*, bucket: str, key: str) -> None:
    try:
        get_storage().delete(bucket=bucket, key=key)
    except Exception:  # the row is gone; a leftover object is logged, not fatal
        log.exception("could not delete %s/%s", bucket, key)
