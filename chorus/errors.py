"""One domain error type for the whole service.

Every error a client can see is a `ChorusError` subclass with a stable `code`
and an HTTP `status`; the API's exception handler renders it in the envelope
`{"error": {"code", "message", "details"}}`. Workers use the same classes so a
failed job can carry the code and message a user can act on.
"""

from __future__ import annotations

from typing import Any


class ChorusError(Exception):
    status: int = 400
    code: str = "bad_request"

    def __init__(
        self,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details or {}
        self.headers: dict[str, str] = headers or {}

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


# --- input --------------------------------------------------------------------


class InvalidInput(ChorusError):
    status = 400
    code = "invalid_request"


class InvalidChoice(InvalidInput):
    """A value outside a field's choices: `details` has `field`, `allowed` and
    `fields` (each invalid field's message, as any invalid request's)."""


class UnknownField(InvalidInput):
    """The body names a field the endpoint does not take (a typo would otherwise
    be dropped silently and its default used); `details.fields` lists them."""

    code = "unknown_field"


class UnprocessableInput(ChorusError):
    status = 422
    code = "unprocessable"


class NotFound(ChorusError):
    status = 404
    code = "not_found"


# --- audio uploads ------------------------------------------------------------


class FileTooLarge(ChorusError):
    status = 413
    code = "file_too_large"


class EmptyFile(ChorusError):
    status = 400
    code = "empty_file"


class UnsupportedAudio(ChorusError):
    """The bytes do not decode as audio in any format we read."""

    status = 415
    code = "unsupported_audio"


class AudioInconsistent(ChorusError):
    """Decodes to far more audio than a file of its size can hold."""

    status = 422
    code = "audio_inconsistent"


class AudioTooShort(ChorusError):
    status = 422
    code = "audio_too_short"


class AudioTooLong(ChorusError):
    status = 422
    code = "audio_too_long"


class SampleRateTooLow(ChorusError):
    status = 422
    code = "sample_rate_too_low"


class SampleRateTooHigh(ChorusError):
    status = 422
    code = "sample_rate_too_high"


class TooManyChannels(ChorusError):
    status = 422
    code = "too_many_channels"


# --- limits -------------------------------------------------------------------


class TextTooLong(ChorusError):
    status = 422
    code = "text_too_long"


class PriorityNotAllowed(ChorusError):
    status = 403
    code = "priority_not_allowed"


# --- what the workers' engine can serve (refused at submit) ----------------------


class VoiceRequired(InvalidInput):
    code = "voice_required"


class UnsupportedText(InvalidInput):
    """Text or instruction the engine cannot speak; `details.reason` says why."""

    code = "unsupported_text"


class InstructionNotSupported(ChorusError):
    status = 422
    code = "instruction_not_supported"


# --- engines and workers --------------------------------------------------------


class EngineError(ChorusError):
    """Synthesis failed for a reason that retrying the same job will not fix."""

    status = 500
    code = "engine_error"


class EngineOutOfMemory(EngineError):
    code = "engine_out_of_memory"


class EngineUnavailable(EngineError):
    """The engine cannot be loaded on this worker (missing library, weights or memory)."""

    code = "engine_unavailable"


class StorageError(ChorusError):
    status = 503
    code = "storage_unavailable"

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        # Counted where it is raised: every backend and every caller alike.
        from chorus.metrics import observe_storage_error

        observe_storage_error(operation=str(self.details.get("operation", "other")))


# --- streams ------------------------------------------------------------------


class ResponseCut(Exception):
    """Raised inside a streamed body, after its headers went out, to end the
    transfer without its final chunk: the client sees a truncated body, which is
    how an audio stream says it failed. Expected, and logged (one line) by
    whoever raises it; the web server closes the connection without a traceback
    (`chorus.web_server`)."""
