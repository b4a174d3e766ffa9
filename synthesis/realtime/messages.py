"""The realtime protocol's messages: what a client may send, checked, and what
the server sends back. docs/api/realtime.md is the reference for clients.

Every refusal is a `ProtocolError` with one of the API's stable codes; the
session answers it with an `error` message and closes the socket with 4000 +
the HTTP status the REST API would give the same error (4400 a bad message,
4401 no credentials, 4403 not allowed, 4429 too many, ...).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from synthesis.realtime.sessions import SessionRequest

DEFAULT_CONTEXT = "default"
MAX_CONTEXT_ID = 64
MAX_MESSAGE_BYTES = 64 * 1024
AUDIO_MODES = ("binary", "json")
FORMATS = ("pcm", "wav", "mp3", "opus")


class ProtocolError(Exception):
    def __init__(self, code: str, message: str, *, status: int = 400):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status

    @property
    def close_code(self) -> int:
        return 4000 + self.status


@dataclass(frozen=True)
class SessionStart:
    request: SessionRequest
    audio: str  # binary or json


@dataclass(frozen=True)
class TextAppend:
    text: str
    context: str | None


@dataclass(frozen=True)
class TextFlush:
    context: str | None


@dataclass(frozen=True)
class ContextCancel:
    context: str | None


@dataclass(frozen=True)
class SessionClose:
    pass


ClientMessage = SessionStart | TextAppend | TextFlush | ContextCancel | SessionClose

_FIELDS: dict[str, frozenset[str]] = {
    "session.start": frozenset(
        {
            "voice_id",
            "format",
            "sample_rate",
            "priority",
            "language",
            "instruction",
            "context_id",
            "store",
            "audio",
        }
    ),
    "text.append": frozenset({"text", "context_id"}),
    "text.flush": frozenset({"context_id"}),
    "context.cancel": frozenset({"context_id"}),
    "session.close": frozenset(),
}


def parse(raw: str) -> ClientMessage:
    """A client's text frame as a message, or `ProtocolError`."""
    if len(raw.encode()) > MAX_MESSAGE_BYTES:
        raise ProtocolError(
            "message_too_large",
            f"A message may be at most {MAX_MESSAGE_BYTES} bytes; send long text in pieces.",
            status=413,
        )
    try:
        data: Any = json.loads(raw)
    except ValueError:
        raise ProtocolError("invalid_json", "A message is one JSON object.") from None
    if not isinstance(data, dict):
        raise ProtocolError("invalid_json", "A message is one JSON object.")
    kind = data.pop("type", None)
    if kind not in _FIELDS:
        raise ProtocolError(
            "unknown_message_type",
            f"Unknown message type {kind!r}; use one of {', '.join(_FIELDS)}.",
        )
    unknown = sorted(set(data) - _FIELDS[kind])
    if unknown:
        raise ProtocolError(
            "unknown_field",
            f"{kind} has no field {unknown[0]!r}; its fields: "
            + (", ".join(sorted(_FIELDS[kind])) or "none")
            + ".",
        )
    if kind == "session.start":
        return _start(data)
    if kind == "text.append":
        text = data.get("text")
        if not isinstance(text, str):
            raise ProtocolError("invalid_request", "text.append needs 'text', a string.")
        return TextAppend(text=text, context=_context(data))
    if kind == "text.flush":
        return TextFlush(_context(data))
    if kind == "context.cancel":
        return ContextCancel(_context(data))
    return SessionClose()


def _start(data: dict[str, Any]) -> SessionStart:
    voice_id = data.get("voice_id")
    if voice_id is not None:
        try:
            voice_id = uuid.UUID(str(voice_id))
        except ValueError:
            raise ProtocolError("invalid_request", "voice_id is a voice's id (a UUID).") from None
    audio_format = data.get("format", "pcm")
    if audio_format not in FORMATS:
        raise ProtocolError(
            "unsupported_output",
            f"format is one of {', '.join(FORMATS)}.",
            status=422,
        )
    sample_rate = data.get("sample_rate")
    if sample_rate is not None and (
        isinstance(sample_rate, bool) or not isinstance(sample_rate, int)
    ):
        raise ProtocolError("invalid_request", "sample_rate is a whole number of Hz.")
    priority = data.get("priority")
    if priority is not None and priority not in ("high", "normal", "low"):
        raise ProtocolError("invalid_request", "priority is high, normal or low.")
    audio = data.get("audio", "binary")
    if audio not in AUDIO_MODES:
        raise ProtocolError("invalid_request", "audio is 'binary' (frames) or 'json'.")
    store = data.get("store", False)
    if not isinstance(store, bool):
        raise ProtocolError("invalid_request", "store is true or false.")
    return SessionStart(
        request=SessionRequest(
            voice_id=voice_id,
            format=audio_format,
            sample_rate=sample_rate,
            priority=priority,
            language=_string(data, "language", 16),
            instruction=_string(data, "instruction", 500),
            context=_context(data) or DEFAULT_CONTEXT,
            store=store,
        ),
        audio=audio,
    )


def _string(data: dict[str, Any], name: str, longest: int) -> str:
    value = data.get(name, "")
    if not isinstance(value, str) or len(value) > longest:
        raise ProtocolError(
            "invalid_request", f"{name} is a string of at most {longest} characters."
        )
    return value


def _context(data: dict[str, Any]) -> str | None:
    value = data.get("context_id")
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_CONTEXT_ID:
        raise ProtocolError(
            "invalid_request", f"context_id is a string of 1 to {MAX_CONTEXT_ID} characters."
        )
    return value


# --- what the server sends ------------------------------------------------------------


def message(kind: str, **fields: Any) -> str:
    return json.dumps({"type": kind, **fields}, separators=(",", ":"))


def error(code: str, text: str, **details: Any) -> str:
    return message("error", code=code, message=text, **({"details": details} if details else {}))
