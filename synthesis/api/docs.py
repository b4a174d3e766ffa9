"""The API reference for voices and speech: what each operation does, request
examples that work unedited, and every error each can answer.

Read by the `extend_schema` decorators in `views.py` and `openai.py`. The
signed-download view is documented here too (`FileDownloadSchema`), as a
replacement that drf-spectacular uses in its place: importing this module
(views.py does) registers it.
"""

from __future__ import annotations

import mimetypes
from typing import Any

from drf_spectacular.extensions import OpenApiViewExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
)

from chorus.api.openapi import (
    INVALID_REQUEST,
    MALFORMED_REQUEST,
    TENANT_ERRORS,
    UNKNOWN_FIELD,
    UNSUPPORTED_MEDIA_TYPE,
    ErrorDoc,
    error_responses,
    not_found,
)
from chorus.errors import (
    AudioInconsistent,
    AudioTooLong,
    AudioTooShort,
    EmptyFile,
    EngineError,
    EngineOutOfMemory,
    FileTooLarge,
    InstructionNotSupported,
    InvalidInput,
    NotFound,
    PriorityNotAllowed,
    SampleRateTooHigh,
    SampleRateTooLow,
    StorageError,
    TextTooLong,
    TooManyChannels,
    UnsupportedAudio,
    UnsupportedText,
    VoiceRequired,
)
from quotas.errors import (
    QuotaExceeded,
    StorageQuotaExceeded,
    TooManyConcurrentJobs,
    VoiceSlotsFull,
)
from synthesis.audio_out import CONTENT_TYPES, FILE_EXTENSIONS, UnsupportedOutput
from synthesis.consent import InvalidConsent, VoiceConsentRequired
from synthesis.longform.submit import LongformTextTooLong
from synthesis.services.jobs import (
    IdempotencyKeyReused,
    JobNotCancellable,
    JobUnconfirmed,
    QueueUnavailable,
)
from synthesis.storage.local import LinkExpired, LinkInvalid

# --- errors ---------------------------------------------------------------------------

VOICE_NOT_FOUND = not_found("voice", voice_id="3f1c2b8e-0000-4000-8000-000000000000")
JOB_NOT_FOUND = not_found("speech job", job_id="3f1c2b8e-0000-4000-8000-000000000000")
STORAGE_UNAVAILABLE = ErrorDoc.of(
    StorageError, "The storage backend could not be reached; nothing was kept. Retry shortly."
)

VOICE_UPLOAD_ERRORS = (
    *TENANT_ERRORS,
    INVALID_REQUEST,
    UNKNOWN_FIELD,
    MALFORMED_REQUEST,
    ErrorDoc.of(EmptyFile, "The uploaded file is empty."),
    ErrorDoc.of(
        VoiceConsentRequired,
        "Your plan requires the speaker's consent for every new voice; send `consent`.",
        field="consent",
    ),
    ErrorDoc.of(
        InvalidConsent,
        "The `consent` field is not a consent record (JSON object with speaker_name, "
        "method, given_at), or `consent_evidence` came without it.",
        field="consent",
    ),
    ErrorDoc.of(
        VoiceSlotsFull, "Your plan's voice slots are all used; delete a voice.", limit=5, value=5
    ),
    ErrorDoc.of(
        StorageQuotaExceeded,
        "This upload does not fit in your plan's storage; delete voices or wait for old "
        "audio to expire.",
    ),
    ErrorDoc.of(
        FileTooLarge,
        "The file is larger than your plan's upload limit (15 MB by default).",
        limit_bytes=15_728_640,
        size_bytes=20_000_000,
    ),
    ErrorDoc.of(UnsupportedAudio, "The file does not decode as WAV, FLAC, OGG or MP3."),
    UNSUPPORTED_MEDIA_TYPE,
    ErrorDoc.of(AudioTooShort, "Less than 3 s of sound (the plan's minimum)."),
    ErrorDoc.of(AudioTooLong, "More than 30 s of sound (the plan's maximum)."),
    ErrorDoc.of(
        AudioInconsistent, "The file decodes to far more audio than a file of its size can hold."
    ),
    ErrorDoc.of(SampleRateTooLow, "Recorded below 16 kHz."),
    ErrorDoc.of(SampleRateTooHigh, "Recorded above 48 kHz."),
    ErrorDoc.of(TooManyChannels, "More than 2 channels."),
    STORAGE_UNAVAILABLE,
)

# Refused at submit, before anything is charged; shared by the speech and batch routes.
SUBMIT_ERRORS = (
    ErrorDoc.of(
        VoiceRequired,
        "The workers' engine (cosyvoice2) clones a voice: pass the id of one of your voices.",
    ),
    ErrorDoc.of(
        UnsupportedText,
        "Text or instruction no engine is given: `<|...|>` control tokens, or text with no "
        "letter or digit (only punctuation, symbols, spaces or invisible characters); "
        "`details.reason` says which. Nothing was charged.",
    ),
    ErrorDoc.of(
        PriorityNotAllowed,
        "Your plan does not include this priority.",
        allowed=["normal", "low"],
        value="high",
    ),
    ErrorDoc.of(
        StorageQuotaExceeded,
        "Your storage is full; delete voices or wait for old audio to expire.",
    ),
    ErrorDoc.of(
        TextTooLong,
        "The text is longer than your plan allows per request; split it.",
        limit=300,
        value=412,
    ),
    ErrorDoc.of(
        LongformTextTooLong,
        "The text is longer than your plan allows in one long-form job; split it. A body "
        "too large to hold any text your plan allows is refused so before it is read "
        "(`details.limit_bytes`, `details.size_bytes`).",
        limit=100000,
        value=120000,
    ),
    ErrorDoc.of(
        UnsupportedOutput,
        "This format and sample rate cannot be produced (opus: 16000, 24000 or 48000 Hz only).",
    ),
    ErrorDoc.of(
        InstructionNotSupported,
        "The workers' engine has no instruct mode (only cosyvoice2 and synthetic have one); "
        "send the request without an instruction.",
        engine="espeak",
        field="instruction",
    ),
    ErrorDoc.of(
        QuotaExceeded,
        "Not enough characters left this billing period; `details.resets_at` says when "
        "they come back.",
    ),
    ErrorDoc.of(
        TooManyConcurrentJobs,
        "As many jobs are queued or running as your plan allows at once; wait for one to finish.",
    ),
    ErrorDoc.of(
        QueueUnavailable,
        "The job queue is unreachable; nothing was charged. Submit again (with the same "
        "`Idempotency-Key`, if you used one).",
    ),
)


# The database failed as the submit waited for its job to reach the disk (`chorus.disk_wait`).
JOB_UNCONFIRMED = ErrorDoc.of(
    JobUnconfirmed,
    "The job was accepted and may run, but the database failed before it could confirm "
    "the job is saved. Read `GET /v1/speech/{details.job_id}` before you submit again.",
    job_id="0b9a1f0e-7c1d-4a7e-9a52-2f1e7c3d5b10",
)


# On a plan without long texts, a body too large for its longest text (chorus.body_limit).
TEXT_BODY_TOO_LARGE = ErrorDoc(
    413,
    "text_too_long",
    "The body is larger than any text your plan allows could make (a plan without "
    "long-form texts); refused before it is read.",
    {"limit_bytes": 5896, "size_bytes": 2000012},
)

SPEECH_CREATE_ERRORS = (
    *TENANT_ERRORS,
    TEXT_BODY_TOO_LARGE,
    ErrorDoc.of(
        InvalidInput,
        "A field is missing or not valid (`details.fields` says which and why), or the "
        "`Idempotency-Key` is longer than 255 characters.",
        fields={"speed": ["Ensure this value is less than or equal to 2.0."]},
    ),
    UNKNOWN_FIELD,
    MALFORMED_REQUEST,
    UNSUPPORTED_MEDIA_TYPE,
    VOICE_NOT_FOUND,
    ErrorDoc.of(
        IdempotencyKeyReused,
        "This `Idempotency-Key` was used in the last 24 h with a different body; use a new key.",
    ),
    *SUBMIT_ERRORS,
    JOB_UNCONFIRMED,
)

OPENAI_SPEECH_ERRORS = (
    *TENANT_ERRORS,
    TEXT_BODY_TOO_LARGE,
    ErrorDoc.of(
        InvalidInput,
        "A field is missing or not valid, e.g. no `voice`; `details.fields` says which and why.",
        fields={"model": ["This field is required."]},
    ),
    MALFORMED_REQUEST,
    ErrorDoc.of(
        NotFound,
        "`voice` is neither one of your voices (by id or name) nor an OpenAI voice name.",
        voice="nobody",
    ),
    *SUBMIT_ERRORS,
    JOB_UNCONFIRMED,
    # The job ended before its first audio: the answer carries the job's own error code.
    ErrorDoc(409, "cancelled", "The job was cancelled before its first audio."),
    ErrorDoc.of(EngineError, "Synthesis failed before the first audio; submit again."),
    ErrorDoc.of(EngineOutOfMemory, "The worker ran out of GPU memory before the first audio."),
    ErrorDoc(
        503,
        "worker_lost",
        "The job's worker stopped three times before the first audio; nothing was charged.",
    ),
)

CANCEL_ERRORS = (
    *TENANT_ERRORS,
    JOB_NOT_FOUND,
    ErrorDoc.of(
        JobNotCancellable,
        "The job has already finished (succeeded, failed or cancelled).",
        status="succeeded",
    ),
)

# --- descriptions -----------------------------------------------------------------------

VOICES_LIST = (
    "Your voices, newest first, with `count`. Paginated: `limit` (default 20, at most 100); "
    "follow `next` (a link with a `cursor`) for the next page. Needs the `read` scope."
)

VOICES_CREATE = """\
Stores a reference recording as a voice to speak with: pass its `id` as `voice_id`
to `POST /v1/speech` (or as `voice` to `POST /v1/audio/speech`).

A `multipart/form-data` form:

- `audio`: the recording (WAV, FLAC, OGG or MP3), validated by decoding it: at most
  your plan's upload size (15 MB by default), 3-30 s of sound, at least 16 kHz,
  mono or stereo;
- `name`: what you call it;
- `transcript` (optional): what is said in the recording; engines that clone
  (cosyvoice2) use it for a closer voice;
- `language` (optional): e.g. `en`;
- `consent` (required on plans that require consent): the speaker's consent, a JSON
  object as the field's value: `{"speaker_name": "Alice Liddell", "method":
  "signed_form", "given_at": "2026-03-01T10:00:00Z"}`, `method` one of
  `recorded_statement`, `signed_form`, `terms_of_service`, `self`; kept after the
  voice is deleted;
- `consent_evidence` (optional, with `consent`): a recording of the consent
  (audio, 1-120 s), kept privately in your bucket.

Each voice takes one of your plan's voice slots and its size counts against your
storage. A form field this route does not take answers 400 `unknown_field`.
Needs the `voices:write` scope."""

VOICES_RETRIEVE = "One of your voices. Needs the `read` scope."

VOICES_DESTROY = (
    "Deletes the voice and its stored recording. Jobs already queued with it fail "
    "(`engine_error`, refunded). Needs the `voices:write` scope."
)

SPEECH_LIST = (
    "Your speech jobs, newest first. Paginated: `limit` (default 20, at most 100); follow "
    "`next` (a link with a `cursor`) for older jobs and `previous` for newer ones: every "
    "page costs the same, however deep. No total count (a tenant may keep millions of "
    "jobs). Needs the `read` scope."
)

SPEECH_CREATE = """\
Turns `text` into audio. Only `text` is required: without `voice_id` the engine's
default voice speaks (the cosyvoice2 engine needs a voice: 400 `voice_required`).
A field this route does not take answers 400 `unknown_field`.

**As a job** (default): answers `202` with the job and its `Location`. Poll
`GET /v1/speech/{id}` until `status` is `succeeded`, then download `audio_url`
(a signed link that expires). The job's `queue` (place in line, estimated start)
is `null` in this answer unless you ask for it with `?queue=true`: working it out
costs more than the submit itself. `GET /v1/speech/{id}` always has it.

**Streamed** (`"stream": true`): answers `200` with the audio itself, sent as the
worker makes it, with `X-Job-Id` and a `Location` for the job:

- `wav` (`audio/wav`): a header whose lengths say "unknown", then mono 16-bit PCM;
- `pcm` (`application/octet-stream`): raw mono 16-bit little-endian PCM;
- `opus` (`audio/ogg`): Ogg Opus pages as they fill;
- `mp3` (`audio/mpeg`) and `flac` (`audio/flac`): the finished file, sent when the job
  is done;
- with `Accept: text/event-stream`: server-sent events, `event: audio` with
  `{"audio": "<base64>"}`, then `event: done` (the job id, `audio_url`) or
  `event: error` (`{"error": {"code", "message"}}`).

The stream is at the engine's own sample rate (`sample_rate` applies to the stored
file). Refusals come as JSON errors before any audio; a job that fails after its
first audio cuts an audio body off (a truncated transfer) or ends the events with
`error`. A client that disconnects cancels the job (refunded) unless it sent
`"keep_on_disconnect": true`.

**Result reuse**: a job asking for exactly what one of yours already produced (same
engine, voice and voice version, text, format, sample rate, speed, instruction) is
answered at once, `202` with `status: succeeded` and its own copy of that audio, no
GPU work. Deterministic engines (espeak) reuse by default; a sampling engine
(cosyvoice2) only with `"reuse": true`; `"reuse": false` always runs the job. A
stream is never answered from storage. Characters are charged as for a new job.

**Long texts**: a text longer than your plan's one-job limit (`max_text_chars`) and
within its long-form limit (`max_longform_chars`; beyond it 413
`longform_text_too_long`) is split at sentence ends (`language`: `en`, `zh` or `ja`;
detected when empty) and its segments run in parallel on the GPU workers. It is
still one job: one `audio_url` for the whole, in the format asked for, at one
loudness; `progress` in the job says how far it is. A streamed long text plays in
order from its first sentence while the rest is made ahead.

Characters are reserved at submit, charged when the job succeeds and refunded if it
fails or is cancelled. The same `Idempotency-Key` with the same body within 24 h
answers with the same job. Needs the `speech:write` scope."""

SPEECH_RETRIEVE = """\
One of your jobs: its `status` (`pending` → `queued` → `running` → `succeeded`,
`failed` or `cancelled`), its place in line and estimated start while it waits,
where its voice prompt came from, its timings, its `error` if it failed, for a long
text its `progress` (segments done of total, seconds of audio so far, an estimated
finish), and once
it succeeded `audio_url`, a signed download link valid until `audio_url_expires_at`;
`reused_from` names the earlier job whose audio answered it (result reuse).
`?fields=id,status,progress` answers with those fields only. Needs the `read` scope."""

SPEECH_CANCEL = (
    "Stops a waiting job at once and a running one within a quarter second (at its next "
    "chunk when chunks come slower); its characters are refunded. A long text's segments "
    "that had started are charged, the rest refunded; once all its segments are made, "
    "its file is joined and delivered instead (409 `job_not_cancellable`, "
    "`details.joining`). A finished job answers 409 `job_not_cancellable`. Needs the "
    "`speech:write` scope."
)

OPENAI_SPEECH = """\
OpenAI's `POST /v1/audio/speech`, so OpenAI's clients work unchanged: point them at
`<server>/v1` with a Chorus key as the API key.

- `input`: the text; `model`: required by OpenAI's clients and otherwise ignored;
- `voice`: one of your voices (id or name), or an OpenAI voice name (`alloy`,
  `echo`, ...), which the engine's default voice speaks;
- `response_format`: `mp3` (default), `opus`, `flac`, `wav` or `pcm` (`aac`: 400);
- `speed` 0.5-2.0; `instructions` (engines with an instruct mode; others answer 422);
- `stream_format`: `audio` (default) or `sse` (OpenAI's `speech.audio.delta` and
  `speech.audio.done` events);
- Chorus extras: `priority`, `keep_on_disconnect`.

Fields this route does not know are ignored, as OpenAI's clients expect. Every call
is a streamed job: the answer starts with the first audio (an error before it is a
JSON error with a status), carries `X-Job-Id` and `Location`, and the file is stored
and charged like any job. Needs the `speech:write` scope."""

# --- examples --------------------------------------------------------------------------

VOICE_EXAMPLES = [
    OpenApiExample(
        "A voice",
        summary="Name and language; choose the recording as `audio`",
        value={"name": "Narrator", "language": "en"},
        request_only=True,
        media_type="multipart/form-data",
    )
]

SPEECH_EXAMPLES = [
    OpenApiExample(
        "A job",
        summary="Queue a job (202), then poll it and download its audio_url",
        value={"text": "Hello from Chorus.", "format": "wav"},
        request_only=True,
    ),
    OpenApiExample(
        "A stream",
        summary="The audio as it is made (200, audio/wav)",
        value={"text": "Hello from Chorus.", "format": "wav", "stream": True},
        request_only=True,
    ),
    OpenApiExample(
        "Options",
        summary="mp3 at 24 kHz, a little faster, low priority",
        value={
            "text": "Hello from Chorus.",
            "format": "mp3",
            "sample_rate": 24000,
            "speed": 1.1,
            "priority": "low",
        },
        request_only=True,
    ),
]

OPENAI_EXAMPLES = [
    OpenApiExample(
        "Audio",
        summary="WAV, streamed as it is made",
        value={
            "model": "tts-1",
            "input": "Hello from Chorus.",
            "voice": "alloy",
            "response_format": "wav",
        },
        request_only=True,
    ),
    OpenApiExample(
        "Events",
        summary="Server-sent events with base64 PCM",
        value={
            "model": "tts-1",
            "input": "Hello from Chorus.",
            "voice": "alloy",
            "response_format": "pcm",
            "stream_format": "sse",
        },
        request_only=True,
    ),
]

# --- streamed answers and headers ------------------------------------------------------

STREAMED_AUDIO = (
    "The audio, sent as it is made (see the description for each format), or "
    "server-sent events with `Accept: text/event-stream` / `stream_format: sse`."
)


def streamed_audio(*, events: str) -> dict[Any, OpenApiResponse]:
    """The 200 of a streamed job: every content type the relay sends, and events."""
    audio = {
        (200, content_type): OpenApiResponse(OpenApiTypes.BINARY, description=STREAMED_AUDIO)
        for content_type in sorted(set(CONTENT_TYPES.values()))
    }
    sse = OpenApiResponse(
        OpenApiTypes.STR,
        description=STREAMED_AUDIO,
        examples=[OpenApiExample("events", value=events)],
    )
    return {**audio, (200, "text/event-stream"): sse}


CHORUS_EVENTS = (
    'event: audio\ndata: {"audio":"UklGRv////9XQVZF..."}\n\n'
    'event: done\ndata: {"job_id":"3f1c2b8e-...","status":"succeeded","duration_s":1.4,'
    '"audio_url":"https://...","audio_url_expires_at":"..."}\n\n'
)
OPENAI_EVENTS = (
    'data: {"type":"speech.audio.delta","audio":"AAABAAIA..."}\n\n'
    'data: {"type":"speech.audio.done","usage":{"input_tokens":18,"output_tokens":0,'
    '"total_tokens":18},"job_id":"3f1c2b8e-...","status":"succeeded"}\n\n'
)

PAGE_PARAMETERS = [
    OpenApiParameter(
        "limit",
        int,
        OpenApiParameter.QUERY,
        required=False,
        description="Items per page: default 20, at most 100.",
    ),
    OpenApiParameter(
        "cursor",
        str,
        OpenApiParameter.QUERY,
        required=False,
        description="Where a page starts, from a `next` or `previous` link; opaque.",
    ),
    OpenApiParameter(
        "offset",
        int,
        OpenApiParameter.QUERY,
        required=False,
        deprecated=True,
        description="Items to skip, for clients written before cursors; it costs what it "
        "skips, so past 10,000 it is refused (400 `offset_too_deep`). Its `next` link "
        "continues with a cursor.",
    ),
]
IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    str,
    OpenApiParameter.HEADER,
    required=False,
    description="Any string up to 255 characters: the same key and body within 24 h give "
    "the same job instead of a new one.",
)
JOB_FIELDS = OpenApiParameter(
    "fields",
    str,
    OpenApiParameter.QUERY,
    required=False,
    description="The job's top-level fields to answer with, separated by commas, e.g. "
    "`id,status,progress,timings,audio_url`: a poll of a long text need not carry its "
    "text back each time. Without it, every field (as before). A name that is not a "
    "field of a job answers 400 `invalid_request` (`details.field`: `fields`).",
)
INVALID_FIELDS = ErrorDoc.of(
    InvalidInput,
    "A query parameter is not valid: `fields` names something that is not a field of a "
    "job, or a `cursor` was not given out by this service.",
    field="fields",
    value="txt",
)
QUEUE_PLACE = OpenApiParameter(
    "queue",
    bool,
    OpenApiParameter.QUERY,
    required=False,
    default=False,
    description="`true`: the 202 answer includes the job's place in line and estimated "
    "start (`queue`), as `GET /v1/speech/{id}` does; otherwise `queue` is `null` there.",
)
JOB_LOCATION = OpenApiParameter(
    "Location",
    str,
    OpenApiParameter.HEADER,
    description="The job's URL, `/v1/speech/{id}`.",
    response=[200, 202],
)
JOB_ID = OpenApiParameter(
    "X-Job-Id", OpenApiTypes.UUID, OpenApiParameter.HEADER, description="The job.", response=[200]
)

# --- signed downloads -------------------------------------------------------------------

FILES_DOWNLOAD = """\
Where a succeeded job's `audio_url` points when storage is a local folder (with S3
it points at the bucket itself). Takes no API key: the link's signature is the
credential. It covers bucket, key, expiry and file name, so a link cannot be edited
into another; it works until `expires` (Unix time). With `filename` the answer is a
download under that name."""

# What FileDownloadView answers with: the type of the stored file's extension.
_DOWNLOAD_TYPES = sorted(
    {
        mimetypes.guess_type(f"a.{ext}")[0] or "application/octet-stream"
        for ext in FILE_EXTENSIONS.values()
    }
)


class FileDownloadSchema(OpenApiViewExtension):
    target_class = "synthesis.api.downloads.FileDownloadView"

    def view_replacement(self) -> Any:
        documented = extend_schema(
            operation_id="files_download",
            summary="Download a stored file through its signed link",
            description=FILES_DOWNLOAD,
            parameters=[
                OpenApiParameter(
                    "expires", int, required=True, description="Unix time the link ends."
                ),
                OpenApiParameter("signature", str, required=True),
                OpenApiParameter(
                    "filename", str, required=False, description="Download under this name."
                ),
            ],
            responses={
                **{
                    (200, content_type): OpenApiResponse(
                        OpenApiTypes.BINARY, description="The file."
                    )
                    for content_type in _DOWNLOAD_TYPES
                },
                **error_responses(
                    ErrorDoc.of(
                        LinkInvalid,
                        "No such file, or the link is not valid (edited or mistyped).",
                    ),
                    ErrorDoc.of(
                        LinkExpired, "The link has expired; read the job again for a new one."
                    ),
                ),
            },
        )

        view: Any = self.target_class  # the class itself once the extension is loaded

        class Documented(view):  # type: ignore[misc]
            get = documented(view.get)

        return Documented
