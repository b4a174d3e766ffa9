"""Where a worker sends audio chunks while it synthesizes (live streaming).

`sink_for(job)` gives the job's sink: a no-op for jobs nobody streams, and a
`RedisStreamSink` for jobs submitted with `stream=True`. The sink appends to a
per-job Redis stream that the web tier relays to the client
(`synthesis.api.streaming`). Its entries are `synthesis.stream_protocol`'s
events: chunks of the attempt that made them, then one done or failed (without
an attempt when the web tier or the sweeper ended the job: `stream_announce_end`).

The stream carries the engine's audio as it comes, at the engine's rate, with
the same 5 ms fades as the stored file (the last 5 ms wait for the end). The
stored file is additionally peak-normalized: one gain that needs the whole
signal, which a live stream cannot know in advance.

A job whose worker died mid-stream runs again as a new attempt, which streams
from the start under its own ``a``; the relay continues the client's audio from
where it was when the engine is deterministic (see
`synthesis.api.streaming.job_events`) and drops what an earlier attempt still
sends.

Streaming is best effort for the worker: Redis trouble is logged and the sink
goes quiet, never failing the job (the file is still stored and charged).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import redis.asyncio as aioredis
from asgiref.sync import sync_to_async
from django.conf import settings

from chorus.db import released
from chorus.redis_client import get_redis, redis_failures
from chorus.redis_location import parse_redis_url
from synthesis.audio_out import FADE_S, to_s16le
from synthesis.engines.base import Engine, Samples
from synthesis.models import FINISHED, Job
from synthesis.stream_protocol import Chunk, Done, Event, Failed, encode

log = logging.getLogger(__name__)

# Bound on a stream's length. A reader that falls this many chunks behind loses
# the oldest (the relay notices the gap in `n` and says so); at 0.25-0.5 s chunks
# this is minutes of audio, far more than a live client lags.
STREAM_MAXLEN = 2048
# While the job runs the key lives at most this long (a worker killed mid-job
# leaves no stream behind for ever); after the final event, briefly.
STREAM_TTL_S = 3600
STREAM_TTL_AFTER_END_S = 120
# A long text's segment is made ahead of its turn and may wait for the client to
# play the segments before it: its stream stays as long as a running job's.
SEGMENT_TTL_AFTER_END_S = STREAM_TTL_S


def stream_key(job_id: uuid.UUID | str) -> str:
    return f"chorus:stream:{job_id}"


def stream_append(client: Any, job_id: uuid.UUID | str, event: Event, *, ttl: int) -> None:
    """Append `event` to the job's stream (bounded to `STREAM_MAXLEN` entries) and
    let the stream live `ttl` seconds more: the one writer of every entry."""
    key = stream_key(job_id)
    pipe = client.pipeline(transaction=False)
    pipe.xadd(key, encode(event), maxlen=STREAM_MAXLEN, approximate=True)
    pipe.expire(key, ttl)
    pipe.execute()


class ChunkSink(Protocol):
    def chunk(self, samples: Samples, sample_rate: int) -> None: ...

    def finish(self) -> None:
        """The job succeeded and its file is stored."""

    def fail(self, *, code: str, message: str) -> None:
        """The job ended without audio (failed, cancelled, superseded)."""


class NullSink:
    def chunk(self, samples: Samples, sample_rate: int) -> None:
        return None

    def finish(self) -> None:
        return None

    def fail(self, *, code: str, message: str) -> None:
        return None


class RedisStreamSink:
    def __init__(
        self,
        *,
        job_id: uuid.UUID | str,
        client: Any,
        attempt: int = 1,
        engine: str = "",
        deterministic: bool = False,
        ttl_after_end: int = STREAM_TTL_AFTER_END_S,
    ) -> None:
        self.job_id = str(job_id)
        self.ttl_after_end = ttl_after_end
        self.attempt = attempt
        self.engine = engine
        self.deterministic = deterministic
        self.key = stream_key(job_id)
        self.client = client
        self.sequence = 0
        self.sample_rate = 0
        self.started = False
        self.broken = False
        self.ended = False
        # The last FADE_S of audio waits here: only the end knows it must fade out.
        self.held = np.zeros(0, dtype=np.float32)

    def chunk(self, samples: Samples, sample_rate: int) -> None:
        if self.broken or self.ended or len(samples) == 0:
            return
        self.sample_rate = sample_rate
        fade = _fade_length(sample_rate)
        pending = np.concatenate([self.held, np.asarray(samples, dtype=np.float32).reshape(-1)])
        if not self.started:
            if len(pending) < 2 * fade:  # not enough yet to fade in and hold back
                self.held = pending
                return
            pending[:fade] *= _ramp(fade)
            self.started = True
        self.held = pending[len(pending) - fade :].copy()
        self._send_pcm(pending[: len(pending) - fade])

    def finish(self) -> None:
        if self.ended:
            return
        tail = self.held
        if len(tail):
            # As `_fade_ends` does it for the stored file: a short signal fades
            # over at most half its length, in and out.
            if self.started:
                fade = len(tail)
            else:
                fade = min(_fade_length(self.sample_rate), len(tail) // 2)
                tail[:fade] *= _ramp(fade)
            if fade:
                tail[len(tail) - fade :] *= _ramp(fade)[::-1]
            self._send_pcm(tail)
        self._end(Done(attempt=self.attempt, job_id=self.job_id))

    def fail(self, *, code: str, message: str) -> None:
        if not self.ended:
            self._end(Failed(code=code, message=message, attempt=self.attempt))

    def _send_pcm(self, samples: Samples) -> None:
        if len(samples) == 0:
            return
        chunk = Chunk(
            pcm=to_s16le(samples),
            sample_rate=self.sample_rate,
            sequence=self.sequence,
            attempt=self.attempt,
            engine=self.engine,
            deterministic=self.deterministic,
        )
        self.sequence += 1
        self._publish(chunk, ttl=STREAM_TTL_S)

    def _end(self, event: Event) -> None:
        self.ended = True
        self._publish(event, ttl=self.ttl_after_end)

    def _publish(self, event: Event, *, ttl: int) -> None:
        if self.broken:
            return
        try:
            stream_append(self.client, self.job_id, event, ttl=ttl)
        except Exception:
            # One warning, then silence: retrying every chunk would slow the job.
            self.broken = True
            log.warning(
                "job %s: cannot publish to its stream; streaming stops", self.job_id, exc_info=True
            )


def _fade_length(sample_rate: int) -> int:
    return round(FADE_S * sample_rate)


def _ramp(length: int) -> Samples:
    # The same half-cosine as `synthesis.audio_out._fade_ends`.
    return (0.5 - 0.5 * np.cos(np.pi * np.arange(length) / length)).astype(np.float32)


def stream_announce_end(*, job_id: uuid.UUID | str, code: str, message: str) -> None:
    """Tell a relay waiting on the job's stream about an ending no worker streams
    (cancelled while waiting, given up after its worker died, never published).

    Without it the relay would only learn from the job's row, which it reads
    rarely (`synthesis.api.streaming`). The entry has no attempt, so it ends the
    stream whichever attempt the relay follows. Best effort, as the sink is.
    """
    _announce(job_id, Failed(code=code, message=message))


def _announce(job_id: uuid.UUID | str, event: Event) -> None:
    client = get_redis()
    if client is None:
        return
    try:
        stream_append(client, job_id, event, ttl=STREAM_TTL_AFTER_END_S)
    except Exception:
        log.warning("job %s: cannot announce its end on its stream", job_id, exc_info=True)


def stream_announce_done(*, job_id: uuid.UUID | str) -> None:
    """Tell a relay that a job whose audio came from other streams (a long-form
    job's segments) is done: its file is stored."""
    _announce(job_id, Done(job_id=str(job_id)))


def sink_for(job: Job, *, attempt: int = 1, engine: Engine | None = None) -> ChunkSink:
    if not job.stream:
        return NullSink()
    client = get_redis()
    if client is None:
        return NullSink()
    return RedisStreamSink(
        job_id=job.id,
        client=client,
        attempt=attempt,
        engine=engine.name if engine is not None else "",
        deterministic=bool(getattr(engine, "deterministic", False)),
        ttl_after_end=SEGMENT_TTL_AFTER_END_S if job.is_segment else STREAM_TTL_AFTER_END_S,
    )


async def stream_client() -> aioredis.Redis:
    """The running event loop's client for relaying streams: one per loop (an
    asyncio client is bound to its loop), whose pool every stream the loop
    relays shares. Callers do not close it.

    A client per stream made a connection per stream: its TCP connect, its
    handshake's round trips, and redis-py's look-up of its own version in the
    installed package's metadata (a file read and parse, per connection): about
    1.5 ms of the web process's CPU per stream, one sixth of it
    (`bench/first_chunk_latency.py`), taken from its other requests. From the
    pool, a stream's reads take a connection that is already open. A read
    waiting in XREAD BLOCK holds its connection; one cancelled mid-read (its
    client left) is disconnected by redis-py before it goes back, so the next
    reader never sees its reply.

    A pooled connection can outlive its server: after a Sentinel failover, say,
    an idle one to the old master's host, gone without a word, would hold the
    next stream for its read timeout (`STREAM_ROW_CHECK_S` + 5 s). So once this
    process has noted a call to Redis as failed (`redis_failures`: a relay's
    read, the rate limiter's, a health check's), the idle connections are closed
    before the next stream takes one, and new ones ask where the master is. A
    read under way meets the failure itself, and redis-py's retry connects anew.
    """
    if not settings.REDIS_URL:
        raise RuntimeError("streaming needs Redis (REDIS_URL)")
    loop, url = asyncio.get_running_loop(), settings.REDIS_URL
    held: _LoopClient | None = getattr(_loop_client, "held", None)
    if held is None or held.loop is not loop or held.url != url:
        # A read may block for the row check's interval: the socket must wait
        # longer than that (the client's own default, 5 s, would end a waiting
        # stream with a timeout). Each stream waiting in a read holds a
        # connection, so the pool has no bound of its own (redis-py's default,
        # 100, would fail the 101st stream of a process): as many as there are
        # streams, as with a client per stream.
        client = parse_redis_url(url).async_client(
            socket_connect_timeout=2,
            socket_timeout=settings.STREAM_ROW_CHECK_S + 5,
            max_connections=_NO_BOUND,
        )
        # Per thread, the latest loop only: a web process runs one loop for its
        # life, and a loop that ended (a test's, say) is let go with its client.
        held = _loop_client.held = _LoopClient(loop, url, client, redis_failures())
    failures = redis_failures()
    if held.failures != failures:
        held.failures = failures  # one purge per failure, however many streams come meanwhile
        # Closing a connection to a silent host may time out in its turn: no stream
        # is failed for that.
        with contextlib.suppress(Exception):
            await held.client.connection_pool.disconnect(inuse_connections=False)
    return held.client


@dataclass
class _LoopClient:
    loop: asyncio.AbstractEventLoop
    url: str
    client: aioredis.Redis
    failures: int  # `redis_failures()` when its idle connections were last known good


_loop_client = threading.local()
_NO_BOUND = 2**31


@sync_to_async
@released
def job_is_finished(job_id: uuid.UUID | str) -> bool:
    """Whether the job's row says it ended (a relay's check between reads)."""
    return Job.objects.filter(pk=job_id, status__in=FINISHED).exists()
