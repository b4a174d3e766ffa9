"""Relaying a job's audio from its Redis stream to an HTTP client as it is made.

The worker appends chunks to the job's stream (`synthesis.streaming`, in the
wire format of `synthesis.stream_protocol`); here the web tier reads them with
`redis.asyncio` (XREAD BLOCK) inside an async iterator, so under the ASGI server
a waiting or slow client holds a coroutine, never a thread. Bodies (encoded by
`synthesis.audio_out.encoder_for`):

* audio: wav (a streaming header whose lengths say "unknown", then s16le),
  pcm (raw s16le), opus (Ogg pages as libopus fills them) arrive as generated,
  at the engine's rate. mp3 and flac cannot be written incrementally by
  libsndfile (both rewrite their headers when the file closes), so those bodies
  are the stored file, sent when the job finishes;
* SSE (`text/event-stream`): the same bytes, base64 in `audio` events, then a
  `done` event with the job id and its signed download link, or an `error`.

A client that goes away before the end cancels the job (refunded), unless it
asked to keep it (`keep_on_disconnect`). An audio body that cannot be completed
(the job failed, was cancelled) is cut off without its final chunk, so the
client sees a truncated transfer rather than a short but "complete" file.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any, Literal

import redis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import StreamingHttpResponse
from django.urls import reverse

from chorus.db import released
from chorus.errors import ResponseCut
from chorus.redis_client import note_redis_failure
from synthesis.audio_out import CONTENT_TYPES, StreamEncoder, encoder_for
from synthesis.longform.split import PAUSE_S
from synthesis.longform.submit import segment_id
from synthesis.models import FINISHED, Job, JobStatus
from synthesis.services.jobs import JobNotCancellable, job_cancel, job_download_url
from synthesis.storage_runtime import get_storage
from synthesis.stream_protocol import (
    Chunk,
    Done,
    Event,
    Failed,
    Said,
    StreamProtocolError,
    decode,
)
from synthesis.streaming import job_is_finished, stream_client, stream_key

log = logging.getLogger(__name__)

Flavor = Literal["chorus", "openai"]

# Formats sent as the stored file once the job is done (see the module docstring).
WHOLE_FILE_FORMATS = ("mp3", "flac")


def _row_check_ms() -> int:
    """How long an XREAD blocks (CHORUS_STREAM_ROW_CHECK_S); between reads with
    nothing new the job row is checked. Every ending is announced on the stream
    (the worker's own; the others through `stream_announce_end`), so the row is
    only a safety net for an announcement that Redis lost: checked rarely, it
    costs a waiting stream almost nothing."""
    return round(settings.STREAM_ROW_CHECK_S * 1000)


# After the row says finished, how long the stream's own last entries may take.
_GRACE_MS = 2000
_SEND_PIECE = 64 * 1024


async def job_events(*, job_id: uuid.UUID, client: Any) -> AsyncIterator[Event]:
    """The job's audio from the start: chunks, then exactly one Done or Failed.

    A job whose worker died runs again as a new attempt that streams from its
    start. With a deterministic engine (the same samples again) the client keeps
    one continuous signal: the new attempt's audio is skipped up to the sample
    the client already has. Other engines' retries would not join without a
    seam, so the stream ends there (`stream_restarted`) while the job goes on to
    its stored file. Whatever an older attempt still sends is dropped.
    """
    key = stream_key(job_id)
    last_id = "0-0"
    attempt = 0  # the newest attempt seen
    expected = 0  # its next sequence number
    position = 0  # samples of the newest attempt seen so far
    delivered = 0  # samples given to the client
    origin: tuple[str, bool] | None = None  # engine and determinism of the client's audio
    sample_rate = 0
    finished_seen = False
    while True:
        try:
            reply = await client.xread(
                {key: last_id}, count=64, block=_GRACE_MS if finished_seen else _row_check_ms()
            )
        except (redis.ConnectionError, redis.TimeoutError):
            note_redis_failure()  # the next `stream_client()` closes the idle connections
            raise
        if not reply:
            if finished_seen:
                yield await _ending_from_row(job_id)
                return
            finished_seen = await job_is_finished(job_id)
            continue
        for entry_id, fields in reply[0][1]:
            last_id = entry_id
            try:
                event = decode(fields)
            except StreamProtocolError as exc:
                # A worker of another release (or a damaged entry): say so, not a 500.
                log.warning("job %s: stream entry %s unreadable: %s", job_id, entry_id, exc)
                yield Failed(
                    "stream_unreadable",
                    "This job's live stream cannot be read here; fetch its file when it is done.",
                )
                return
            made_by = event.attempt if event.attempt is not None else (attempt or 1)
            if made_by < attempt:
                continue  # a superseded attempt, still running somewhere
            if isinstance(event, Chunk):
                made_with = (event.engine, event.deterministic)
                if made_by > attempt:
                    if delivered and not (made_with == origin and event.deterministic):
                        yield Failed(
                            "stream_restarted",
                            "The job was restarted after its worker stopped, on an engine "
                            "whose new audio would not join the old without a seam. The job "
                            "goes on: fetch its file when it is done.",
                        )
                        return
                    attempt, expected, position = made_by, 0, 0
                if event.sequence != expected:
                    yield Failed(
                        "stream_lagged",
                        "This client fell too far behind the stream; fetch the job's file instead.",
                    )
                    return
                expected += 1
                if sample_rate and event.sample_rate != sample_rate:
                    yield Failed(
                        "stream_restarted",
                        "The job was restarted on an engine with another sample rate; "
                        "fetch the job's file when it is done.",
                    )
                    return
                sample_rate = event.sample_rate
                already = max(0, delivered - position) * 2  # bytes the client has
                position += len(event.pcm) // 2
                if already < len(event.pcm):
                    delivered = position
                    origin = made_with
                    # (An alignment, once engines send one, is relative to the chunk's
                    # start: a trimmed chunk's must be shifted by what was cut.)
                    yield replace(event, pcm=event.pcm[already:]) if already else event
            elif isinstance(event, Said):
                continue  # a realtime session's (synthesis.realtime); never in a job's stream
            else:
                yield event
                return


def stream_events(*, job: Job, client: Any) -> AsyncIterator[Event]:
    """A streamed job's events: its own stream, or a long-form job's segments."""
    if job.is_longform:
        return longform_events(job=job, client=client)
    return job_events(job_id=job.id, client=client)


async def longform_events(*, job: Job, client: Any) -> AsyncIterator[Event]:
    """A long-form job's audio in text order: each segment's stream in turn (all
    of them are computed ahead in parallel, so a later one is usually complete
    when its turn comes), with the join's pause between them; then the job's own
    ending (the join done, or a failure or cancel) from the job's stream."""
    index = 0
    total = 1  # segment 0 exists from the start; the rest once the text is split
    while index < total:
        sample_rate = 0
        async for event in job_events(job_id=segment_id(job.id, index), client=client):
            if isinstance(event, Chunk):
                if index and not sample_rate:
                    pause = bytes(2 * round(PAUSE_S * event.sample_rate))
                    yield Chunk(pcm=pause, sample_rate=event.sample_rate)
                sample_rate = event.sample_rate
                yield event
            elif isinstance(event, Done):
                break
            else:
                yield event
                return
        index += 1
        if index == total:
            total = await _segments_total(job.id)
    async for event in job_events(job_id=job.id, client=client):
        yield event
        if not isinstance(event, Chunk):
            return


async def _segments_total(job_id: uuid.UUID) -> int:
    """The job's segment count once its text is split (0 until then; the split
    takes a fraction of a second, segment 0 far longer)."""
    while True:
        total, ended = await _split_state(job_id)
        if total or ended:
            return total
        await asyncio.sleep(0.05)


@sync_to_async
@released
def _split_state(job_id: uuid.UUID) -> tuple[int, bool]:
    total, status = Job.objects.values_list("segments_total", "status").get(pk=job_id)
    return int(total or 0), status in FINISHED


@sync_to_async
@released
def _ending_from_row(job_id: uuid.UUID) -> Event:
    job = Job.objects.get(pk=job_id)
    if job.status == JobStatus.SUCCEEDED:
        # The worker could not stream the end (Redis trouble); the file is complete.
        return Failed(
            "stream_incomplete",
            "The job succeeded but its live stream is incomplete; fetch the job's file.",
        )
    return Failed(job.error_code or job.status, job.error_message or f"The job {job.status}.")


# --- SSE framing -------------------------------------------------------------------


class EventFramer:
    """Server-sent events in Chorus's shape (named events) or OpenAI's (`type`)."""

    def __init__(self, flavor: Flavor) -> None:
        self.flavor = flavor

    def audio(self, data: bytes) -> bytes:
        b64 = base64.b64encode(data).decode()
        if self.flavor == "openai":
            return _sse({"type": "speech.audio.delta", "audio": b64})
        return _sse({"audio": b64}, event="audio")

    def done(self, summary: dict[str, Any]) -> bytes:
        if self.flavor == "openai":
            characters = summary.get("characters", 0)
            usage = {"input_tokens": characters, "output_tokens": 0, "total_tokens": characters}
            return _sse({"type": "speech.audio.done", "usage": usage, **summary})
        return _sse(summary, event="done")

    def error(self, code: str, message: str) -> bytes:
        error = {"code": code, "message": message}
        if self.flavor == "openai":
            return _sse({"type": "error", "error": error})
        return _sse({"error": error}, event="error")


def _sse(payload: dict[str, Any], event: str = "") -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


# --- the relay -------------------------------------------------------------------


class StreamAborted(ResponseCut):
    """Raised inside an audio body to cut the transfer off (no final chunk)."""


# Cancellations started while a request was being torn down; kept so they finish.
_background: set[asyncio.Task[Any]] = set()


async def relay(
    *,
    job: Job,
    sse: EventFramer | None,
    keep_on_disconnect: bool,
    events: AsyncIterator[Event] | None = None,
) -> AsyncIterator[bytes]:
    """The response body for a streamed job. `events` lets a caller that already
    read the first event (to answer errors with a status) hand the rest over."""
    ended = False
    encoder: StreamEncoder | None = None
    whole = job.format in WHOLE_FILE_FORMATS
    try:
        if events is None:  # in the `try`: a client that leaves meanwhile cancels the job
            events = stream_events(job=job, client=await stream_client())
        async for event in events:
            if isinstance(event, Chunk):
                if whole:
                    continue
                if encoder is None:
                    encoder = encoder_for(job.format, event.sample_rate)
                    if encoder is None:  # opus at a rate libopus lacks: the stored file
                        whole = True
                        continue
                data = encoder.feed(event.pcm)
                if data:
                    yield sse.audio(data) if sse else data
            elif isinstance(event, Done):
                ended = True
                if whole:
                    stored = await _stored_file(job.id)
                    for start in range(0, len(stored), _SEND_PIECE):
                        piece = stored[start : start + _SEND_PIECE]
                        yield sse.audio(piece) if sse else piece
                elif encoder is not None:
                    tail = encoder.close()
                    if tail:
                        yield sse.audio(tail) if sse else tail
                if sse:
                    yield sse.done(await _summary(job.id))
                return
            elif isinstance(event, Failed):
                ended = True
                if sse:
                    yield sse.error(event.code, event.message)
                    return
                log.warning("stream of job %s cut off: %s", job.id, event.code)
                raise StreamAborted(f"{event.code}: {event.message}")
    finally:
        if not ended and not keep_on_disconnect:
            task = asyncio.get_running_loop().create_task(cancel_quietly(job))
            _background.add(task)
            task.add_done_callback(_background.discard)
            # If this is cancelled too, the shielded task still runs to its end.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)


@sync_to_async
@released
def cancel_quietly(job: Job) -> None:
    try:
        job_cancel(tenant=job.tenant, job=job)
        log.info("job %s cancelled: its streaming client went away", job.id)
    except JobNotCancellable:
        pass  # finished meanwhile; it stays as it ended


@sync_to_async
@released
def _stored_file(job_id: uuid.UUID) -> bytes:
    job = Job.objects.select_related("tenant").get(pk=job_id)
    return get_storage().get(bucket=job.tenant.bucket, key=job.output_key)


@sync_to_async
@released
def _summary(job_id: uuid.UUID) -> dict[str, Any]:
    job = Job.objects.select_related("tenant", "tenant__plan").get(pk=job_id)
    link = job_download_url(job=job)
    return {
        "job_id": str(job.id),
        "status": job.status,
        "characters": job.characters,
        "format": job.format,
        "sample_rate": job.sample_rate,
        "duration_s": job.duration_s,
        "audio_url": link[0] if link else None,
        "audio_url_expires_at": link[1].isoformat() if link else None,
    }


def streaming_response(
    *,
    job: Job,
    sse: EventFramer | None,
    keep_on_disconnect: bool,
    body: AsyncIterator[bytes] | None = None,
) -> StreamingHttpResponse:
    response = StreamingHttpResponse(
        body or relay(job=job, sse=sse, keep_on_disconnect=keep_on_disconnect),
        content_type="text/event-stream" if sse else CONTENT_TYPES[job.format],
    )
    response["Cache-Control"] = "no-store"
    response["X-Accel-Buffering"] = "no"  # a buffering proxy would undo the point
    response["X-Job-Id"] = str(job.id)
    response["Location"] = reverse("speech-detail", kwargs={"job_id": job.id})
    return response


def wants_event_stream(accept: str) -> bool:
    return "text/event-stream" in accept.lower()
