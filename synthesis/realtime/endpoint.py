"""`GET /v1/speech/realtime`: the realtime session's WebSocket (an ASGI app).

One connection is one session: authenticate (the `Authorization` header, or a
client token as `?token=`), wait for `session.start`, open the session's job,
then run two loops until the session ends:

* the client's messages: checked (`messages`), text reserved (`sessions`) and
  passed to the worker over the session's input stream (`channel`);
* the job's stream: audio relayed as binary frames (or JSON), each context's
  `said` as `audio.done`, the end as `session.closed`.

A client that goes away stops its session: the worker sees `gone` between two
chunks, or the job is cancelled (refunded) if no worker had it yet. A worker
that dies is noticed by its liveness key vanishing: the client gets
`worker_lost` within `ALIVE_TTL_MS` plus a read, and the job is cancelled.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async

from chorus.db import released
from chorus.errors import ChorusError
from quotas.admission import check_rate, check_scope
from synthesis.audio_out import encoder_for
from synthesis.models import Job, JobStatus
from synthesis.realtime import messages as m
from synthesis.realtime.channel import Append, Cancel, Close, Flush, Gone, alive_key, send
from synthesis.realtime.encoders import Mp3Encoder
from synthesis.realtime.sessions import OpenSession, session_open, session_reserve
from synthesis.realtime.tokens import token_redeem
from synthesis.services.jobs import JobNotCancellable, job_cancel, job_download_url
from synthesis.stream_protocol import Chunk, Done, Failed, Said, StreamProtocolError, decode
from synthesis.streaming import job_is_finished, stream_client, stream_key
from tenants.authentication import api_key_from_credentials_async
from tenants.models import ApiKey

log = logging.getLogger(__name__)

PATH = "/v1/speech/realtime"
START_TIMEOUT_S = 10.0
# How long the relay's XREAD blocks: between reads the worker's liveness is checked.
READ_BLOCK_MS = 500

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def realtime_endpoint(scope: Scope, receive: Receive, send_: Send) -> None:
    connect = await receive()
    if connect["type"] != "websocket.connect":
        return
    await send_({"type": "websocket.accept"})
    socket = _Socket(receive, send_)
    try:
        api_key = await _authenticate(scope)
        start = await socket.first_start()
        session = await _open(api_key, start.request)
    except m.ProtocolError as exc:
        await socket.refuse(exc)
        return
    except _ClientGone:
        return
    await _Session(socket, session, audio=start.audio, context=start.request.context).run()


class _ClientGone(Exception):
    pass


class _Socket:
    def __init__(self, receive: Receive, send: Send) -> None:
        self._receive = receive
        self._send = send
        self.closed = False

    async def text(self, payload: str) -> None:
        await self._frame({"type": "websocket.send", "text": payload})

    async def binary(self, payload: bytes) -> None:
        await self._frame({"type": "websocket.send", "bytes": payload})

    async def _frame(self, event: dict[str, Any]) -> None:
        if self.closed:
            return
        try:
            await self._send(event)
        except OSError:  # the client went away: the session still runs to its end
            self.closed = True

    async def close(self, code: int = 1000) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(Exception):  # the client may be gone already
                await self._send({"type": "websocket.close", "code": code})

    async def refuse(self, exc: m.ProtocolError) -> None:
        await self.text(m.error(exc.code, exc.message))
        await self.close(exc.close_code)

    async def next_message(self) -> m.ClientMessage:
        """The client's next message; `_ClientGone` when it disconnected."""
        event = await self._receive()
        if event["type"] == "websocket.disconnect":
            self.closed = True
            raise _ClientGone()
        if event.get("text") is None:
            raise m.ProtocolError(
                "binary_not_accepted", "Send JSON text frames; audio only flows to the client."
            )
        return m.parse(event["text"])

    async def first_start(self) -> m.SessionStart:
        try:
            first = await asyncio.wait_for(self.next_message(), timeout=START_TIMEOUT_S)
        except TimeoutError:
            raise m.ProtocolError(
                "session_start_timeout",
                f"Send session.start within {START_TIMEOUT_S:.0f} s of connecting.",
                status=408,
            ) from None
        if not isinstance(first, m.SessionStart):
            raise m.ProtocolError("session_not_started", "The first message is session.start.")
        return first


async def _authenticate(scope: Scope) -> ApiKey:
    headers = dict(scope.get("headers") or [])
    authorization = headers.get(b"authorization")
    query = parse_qs((scope.get("query_string") or b"").decode("latin-1"))
    token = query.get("token", [""])[0]
    try:
        if token and authorization:
            raise m.ProtocolError(
                "invalid_authorization",
                "Authenticate once: the Authorization header or ?token=.",
                status=401,
            )
        if token:
            key = await _key_of_token(token)
        else:
            key = await api_key_from_credentials_async(authorization=authorization)
        await _admit(key)
    except ChorusError as exc:
        raise _protocol_error(exc) from None
    return key


async def _key_of_token(token: str) -> ApiKey:
    found = await token_redeem(client=await stream_client(), raw=token)
    if found is None:
        raise m.ProtocolError(
            "invalid_token",
            "Unknown, expired or used client token: make a new one (POST /v1/realtime/tokens).",
            status=401,
        )
    key = await _live_key(found[0])
    if key is None or key.tenant_id != found[1]:
        raise m.ProtocolError(
            "invalid_token", "The key that made this token is revoked.", status=401
        )
    return key


@sync_to_async
@released
def _live_key(key_id: int) -> ApiKey | None:
    return (
        ApiKey.objects.select_related("tenant", "tenant__plan")
        .filter(pk=key_id, revoked_at__isnull=True, tenant__active=True)
        .first()
    )


@sync_to_async
@released
def _admit(key: ApiKey) -> None:
    check_scope(api_key=key, needed="speech:write")
    check_rate(tenant=key.tenant, api_key=key)


@sync_to_async
@released
def _open(key: ApiKey, request: Any) -> OpenSession:
    try:
        return session_open(api_key=key, request=request)
    except ChorusError as exc:
        raise _protocol_error(exc) from None


def _protocol_error(exc: ChorusError) -> m.ProtocolError:
    """The API's error as the socket's: its code, and its status in the close code."""
    return m.ProtocolError(exc.code, exc.message, status=exc.status)


class _Session:
    def __init__(self, socket: _Socket, session: OpenSession, *, audio: str, context: str) -> None:
        self.socket = socket
        self.session = session
        self.job = session.job
        self.json_audio = audio == "json"
        self.context = context  # where appends without a context_id go
        self.dropping: dict[str, int] = {}  # context -> cancels whose said is still to come
        self.closing = False
        self.seq = 0
        self.encoder: Any = None
        self.encoded_context: str | None = None  # whose audio the encoder was fed last
        self.client: Any = None  # the loop's (`stream_client`), once the session runs

    async def run(self) -> None:
        self.client = await stream_client()
        await self.socket.text(
            m.message("session.started", session_id=str(self.job.id), job_id=str(self.job.id))
        )
        relay = asyncio.create_task(self._relay())
        reader = asyncio.create_task(self._read())
        done, _ = await asyncio.wait({relay, reader}, return_when=asyncio.FIRST_COMPLETED)
        if reader in done and not self.closing:
            # The client went away (or was refused): the relay has nobody to send to.
            relay.cancel()
        # After a close the relay goes on to the session's end.
        with contextlib.suppress(asyncio.CancelledError):
            await relay
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader

    # --- the client's side -----------------------------------------------------------

    async def _read(self) -> None:
        try:
            while True:
                message = await self.socket.next_message()
                await self._take(message)
        except _Stop:
            return
        except _ClientGone:
            await self._client_gone()
        except m.ProtocolError as exc:
            await self.socket.refuse(exc)
            await self._client_gone()

    async def _take(self, message: m.ClientMessage) -> None:
        if isinstance(message, m.SessionStart):
            raise m.ProtocolError("session_already_started", "This session has started already.")
        if isinstance(message, m.TextAppend):
            context = self._context(message.context)
            if not message.text:
                return
            limit = self.session.realtime.max_characters
            if self.session.sent + len(message.text) > limit:
                raise m.ProtocolError(
                    "session_text_too_long",
                    f"A session may send {limit} characters of text; this one has sent "
                    f"{self.session.sent}. Open a new session for more.",
                    status=413,
                )
            await self._reserve(len(message.text))
            await send(self.client, self.job.id, Append(context=context, text=message.text))
        elif isinstance(message, m.TextFlush):
            await send(self.client, self.job.id, Flush(self._context(message.context)))
        elif isinstance(message, m.ContextCancel):
            context = self._context(message.context)
            self.dropping[context] = self.dropping.get(context, 0) + 1
            if isinstance(self.encoder, Mp3Encoder) and self.encoded_context == context:
                # What LAME holds of it (up to a frame, ~50 ms) must not come out at
                # the start of the next audio: MPEG frames from a new encoder follow
                # on. (An Ogg stream cannot start over: see the docs on opus.)
                self.encoder = None
            await send(self.client, self.job.id, Cancel(context))
        else:
            self.closing = True
            await send(self.client, self.job.id, Close())
            raise _Stop()  # nothing more is read: the relay goes on to the session's end

    def _context(self, asked: str | None) -> str:
        if asked is not None:
            self.context = asked  # a new context becomes the one appends go to
        return self.context

    async def _reserve(self, characters: int) -> None:
        try:
            await _reserve(self.session, characters)
        except ChorusError as exc:
            raise _protocol_error(exc) from None

    async def _client_gone(self) -> None:
        with contextlib.suppress(Exception):
            await send(self.client, self.job.id, Gone())
        await _cancel_if_waiting(self.job)

    # --- the worker's side -----------------------------------------------------------

    async def _relay(self) -> None:
        key = stream_key(self.job.id)
        last_id = "0-0"
        seen_alive = False
        while True:
            reply = await self.client.xread({key: last_id}, count=64, block=READ_BLOCK_MS)
            if not reply:
                alive = await self.client.exists(alive_key(self.job.id))
                if alive:
                    seen_alive = True
                elif seen_alive or await job_is_finished(self.job.id):
                    await self._worker_lost(seen_alive)
                    return
                continue
            for entry_id, fields in reply[0][1]:
                last_id = entry_id
                try:
                    event = decode(fields)
                except StreamProtocolError as exc:
                    log.warning("session %s: unreadable stream entry: %s", self.job.id, exc)
                    continue
                if isinstance(event, Chunk):
                    seen_alive = True
                    await self._audio(event)
                elif isinstance(event, Said):
                    await self._said(event)
                elif isinstance(event, Done):
                    await self._closed(event.ending)
                    return
                elif isinstance(event, Failed):
                    await self.socket.text(m.error(event.code, event.message))
                    await self.socket.close(4500)
                    return

    async def _audio(self, chunk: Chunk) -> None:
        if chunk.context is not None and self.dropping.get(chunk.context):
            return  # cancelled: the worker has not seen it yet
        if self.encoder is None:
            self.encoder = _encoder(self.job.format, chunk.sample_rate)
        self.encoded_context = chunk.context
        await self._send_audio(self.encoder.feed(chunk.pcm), chunk.context)

    async def _send_audio(self, data: bytes, context: str | None) -> None:
        """Encoded audio as a binary frame, or as an `audio` message."""
        if not data:
            return
        if not self.json_audio:
            await self.socket.binary(data)
            return
        audio = base64.b64encode(data).decode()
        await self.socket.text(m.message("audio", context_id=context, audio=audio, seq=self.seq))
        self.seq += 1

    async def _said(self, said: Said) -> None:
        if said.why == "cancel":
            left = self.dropping.get(said.context, 0) - 1
            if left > 0:
                self.dropping[said.context] = left
            else:
                self.dropping.pop(said.context, None)
        await self.socket.text(
            m.message(
                "audio.done",
                context_id=said.context,
                characters=said.characters,
                **({"cancelled": True} if said.why == "cancel" else {}),
            )
        )

    async def _closed(self, ending: str) -> None:
        if self.encoder is not None:
            await self._send_audio(self.encoder.close(), self.context)
        summary = await _summary(self.job.id)
        if ending:
            await self.socket.text(m.error(ending, _ENDINGS.get(ending, "The session ended.")))
        await self.socket.text(m.message("session.closed", **summary))
        await self.socket.close(_ENDING_CLOSE.get(ending, 1000))

    async def _worker_lost(self, started: bool) -> None:
        if started:
            await _cancel_if_running(self.job)
            message = (
                "The worker running this session stopped; nothing more was charged. "
                "Start a new session to go on."
            )
            await self.socket.text(m.error("worker_lost", message))
            await self.socket.close(4503)
            return
        row = await _row(self.job.id)
        await self.socket.text(
            m.error(row.error_code or row.status, row.error_message or f"The session {row.status}.")
        )
        await self.socket.close(4500)


class _Stop(Exception):
    pass


_ENDINGS = {
    "session_idle_timeout": "No text came for the plan's idle timeout: the session is closed.",
    "session_too_long": "The session reached the plan's longest session: it is closed.",
}
_ENDING_CLOSE = {"session_idle_timeout": 4408, "session_too_long": 4408}


def _encoder(audio_format: str, sample_rate: int) -> Any:
    if audio_format == "mp3":
        return Mp3Encoder(sample_rate)
    encoder = encoder_for(audio_format, sample_rate)
    assert encoder is not None, f"{audio_format} at {sample_rate} Hz"  # checked at start
    return encoder


@sync_to_async
@released
def _reserve(session: OpenSession, characters: int) -> None:
    session_reserve(session=session, characters=characters)


@sync_to_async
@released
def _row(job_id: uuid.UUID) -> Job:
    return Job.objects.get(pk=job_id)


@sync_to_async
@released
def _cancel_if_waiting(job: Job) -> None:
    """A session no worker has taken yet is cancelled (refunded) with its client."""
    if Job.objects.filter(pk=job.pk, status__in=[JobStatus.PENDING, JobStatus.QUEUED]).exists():
        with contextlib.suppress(JobNotCancellable):
            job_cancel(tenant=job.tenant, job=job)


@sync_to_async
@released
def _cancel_if_running(job: Job) -> None:
    with contextlib.suppress(JobNotCancellable):
        job_cancel(tenant=job.tenant, job=job)


@sync_to_async
@released
def _summary(job_id: uuid.UUID) -> dict[str, Any]:
    job = Job.objects.select_related("tenant", "tenant__plan").get(pk=job_id)
    link = job_download_url(job=job) if job.output_key else None
    return {
        "session_id": str(job.id),
        "characters": job.characters,
        "audio_seconds": job.duration_s or 0.0,
        "audio_url": link[0] if link else None,
    }
