"""What one speech job is asked for, typed once.

Every entry point builds a `SpeechRequest` once (the native API, the
OpenAI-compatible route, a batch's item, a long text's segment from its
parent) and passes it whole: to `job_create`, to result reuse, to the
idempotency fingerprint, to the job's row.

Who asks and in which queue (tenant, API key, priority, Idempotency-Key) is the
submit's context, not part of the request: a batch's items share their batch's
priority and key, a segment inherits its parent's, and none of them changes
what is spoken.

Adding a field: declare it here with its default and give the serializers a
field of the same name (`from_data` picks it up); the job's row takes it in a
column of the same name (a migration). The idempotency fingerprint and the
reuse key take a new field only when it differs from its default, so every key
made before it was added still matches; list it in `_NOT_IN_AUDIO` if it never
changes the audio (then it never splits the reuse key).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from synthesis.models import Job, Voice


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeechRequest:
    text: str
    voice_id: uuid.UUID | None = None  # None: the engine's default voice
    format: str = "wav"
    sample_rate: int | None = None  # None: the engine's own (opus: 48000)
    speed: float = 1.0
    instruction: str = ""
    language: str = ""  # for splitting a long text; empty: detected
    stream: bool = False
    reuse: bool | None = None  # None: where the engine is deterministic

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> SpeechRequest:
        """From a serializer's validated data: the keys named as this class's fields
        (the rest, such as `priority` or `custom_id`, are the caller's)."""
        return cls(**{name: data[name] for name in _names(cls) if name in data})

    @classmethod
    def of_job(cls, job: Job) -> SpeechRequest:
        """What `job` was asked, read back from its row (`reuse` is not kept)."""
        return cls(
            **{
                name: getattr(job, _COLUMNS.get(name, name))
                for name in _names(cls)
                if name not in _NOT_COLUMNS
            }
        )

    def job_fields(self) -> dict[str, Any]:
        """The job row's columns for this request, less its voice (the caller has
        resolved it, or copies a parent's) and its reuse key (it needs the tenant)."""
        fields = {
            _COLUMNS.get(name, name): getattr(self, name)
            for name in _names(type(self))
            if name not in _NOT_COLUMNS and name != "voice_id"
        }
        fields["characters"] = len(self.text)
        return fields

    def fingerprint(self, *, priority: str) -> str:
        """What an Idempotency-Key remembers of its request: the same request in
        the same queue gives the same fingerprint."""
        parts: list[object] = [
            self.text,
            self.voice_id,
            priority,
            self.format,
            self.sample_rate,
            self.speed,
            self.instruction,
            self.stream,
            self.reuse,
            self.language,
        ]
        return fingerprint_of(*parts, *self._added(_FINGERPRINTED))

    def reuse_key(self, *, tenant_id: int, engine: str, voice: Voice | None) -> str:
        """Which earlier results may answer this request (`synthesis.services.reuse`).
        `voice` is the request's voice, read: its version is part of the key."""
        parts: list[Any] = [
            tenant_id,  # never another tenant's audio, even for the same text
            engine,
            str(voice.id) if voice else "",
            voice.version if voice else 0,  # a new recording never gets the old one's audio
            self.text,
            self.format,
            self.sample_rate,
            repr(float(self.speed)),
            self.instruction,
            *self._added(_REUSE_KEYED | _NOT_IN_AUDIO),
        ]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()

    def batch_item_fields(self) -> dict[str, Any]:
        """The request as a batch's fingerprint has always read an item's: the
        fields and order of the item spec the batch API once had."""
        fields = {
            "text": self.text,
            "voice_id": self.voice_id,
            "audio_format": self.format,
            "sample_rate": self.sample_rate,
            "speed": self.speed,
            "instruction": self.instruction,
            "reuse": self.reuse,
        }
        # A batch's items are never streamed and keep no language: neither was ever
        # part of it, so only a value other than the default is.
        return {**fields, **dict(self._added(frozenset(fields) | {"audio_format", "format"}))}

    def _added(self, known: frozenset[str]) -> list[tuple[str, str]]:
        """Fields not in `known` (added since the key's layout was fixed) that
        differ from their default, as (name, value) pairs: a key made without them
        is still the same key."""
        return [
            (f.name, str(getattr(self, f.name)))
            for f in dataclasses.fields(self)
            if f.name not in known and getattr(self, f.name) != f.default
        ]


def fingerprint_of(*parts: object) -> str:
    """A hash of a request's parts, each as its `str`."""
    return hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()


def _names(cls: type[SpeechRequest]) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


# Request fields whose job column is named otherwise, and those that have none.
_COLUMNS = {"sample_rate": "requested_sample_rate"}
_NOT_COLUMNS = frozenset({"reuse"})
# The fields each key was first made of (its layout, fixed: keys already stored
# must still match), and those that never change the audio.
_FINGERPRINTED = frozenset(
    {
        "text",
        "voice_id",
        "format",
        "sample_rate",
        "speed",
        "instruction",
        "stream",
        "reuse",
        "language",
    }
)
_REUSE_KEYED = frozenset({"text", "voice_id", "format", "sample_rate", "speed", "instruction"})
_NOT_IN_AUDIO = frozenset({"stream", "reuse", "language"})
