"""Live streaming pieces: the worker's Redis-stream sink, the web tier's relay
(read, encode, frame, cancel on disconnect) and `/v1/speech` with `stream`."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import redis
import redis.asyncio as aioredis
import soundfile as sf
from asgiref.sync import async_to_sync, sync_to_async
from django.test import AsyncClient
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff

from chorus.redis_client import (
    get_redis,
    note_redis_failure,
    redis_failures,
    redis_failures_forget,
)
from quotas.models import LedgerEntry
from synthesis.api import streaming as relay_module
from synthesis.api.streaming import EventFramer, job_events, relay
from synthesis.audio_out import OpusEncoder, _fade_ends, to_s16le, wav_stream_header
from synthesis.models import Job, JobStatus
from synthesis.services.execution import MAX_ATTEMPTS, job_give_up
from synthesis.services.jobs import job_cancel, job_create
from synthesis.speech_request import SpeechRequest
from synthesis.stream_protocol import Chunk, Done, Event, Failed, decode
from synthesis.streaming import (
    STREAM_TTL_AFTER_END_S,
    NullSink,
    RedisStreamSink,
    sink_for,
    stream_client,
    stream_key,
)
from tests.assertions import assert_error
from tests.conftest import Persona

RATE = 24000


@pytest.fixture
def client() -> redis.Redis:
    connection = get_redis()
    assert connection is not None, "tests need REDIS_URL"
    return connection


def _entries(client: redis.Redis, job_id: uuid.UUID) -> list[Event]:
    return [decode(fields) for _, fields in client.xrange(stream_key(job_id))]


def _signal(seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.3 * rng.uniform(-1, 1, round(seconds * RATE))).astype(np.float32)


# --- the worker's sink --------------------------------------------------------------


def test_jobs_nobody_streams_get_the_null_sink() -> None:
    assert isinstance(sink_for(Job(id=uuid.uuid4(), stream=False)), NullSink)
    assert isinstance(sink_for(Job(id=uuid.uuid4(), stream=True)), RedisStreamSink)


@pytest.mark.parametrize("seconds", [1.3, 0.004])  # long, and shorter than both fades
def test_the_streamed_pcm_is_the_faded_signal_the_file_is_made_from(
    client: redis.Redis, seconds: float
) -> None:
    job_id = uuid.uuid4()
    signal = _signal(seconds)
    sink = RedisStreamSink(job_id=job_id, client=client)
    for start in range(0, len(signal), 2400):  # uneven last piece
        sink.chunk(signal[start : start + 2400].copy(), RATE)
    sink.finish()

    entries = _entries(client, job_id)
    chunks = [e for e in entries if isinstance(e, Chunk)]
    assert entries[-1] == Done(attempt=1, job_id=str(job_id))
    assert [e.sequence for e in chunks] == list(range(len(chunks)))
    assert {e.sample_rate for e in chunks} == {RATE}
    streamed = b"".join(e.pcm for e in chunks)
    assert streamed == to_s16le(_fade_ends(signal, RATE))
    assert 0 < client.ttl(stream_key(job_id)) <= STREAM_TTL_AFTER_END_S


def test_the_first_chunk_is_published_as_soon_as_it_comes(client: redis.Redis) -> None:
    job_id = uuid.uuid4()
    sink = RedisStreamSink(job_id=job_id, client=client)
    sink.chunk(_signal(0.2), RATE)
    (entry,) = _entries(client, job_id)
    assert isinstance(entry, Chunk)
    # All but the last 5 ms, which wait to learn whether they are the end.
    assert len(entry.pcm) == 2 * (round(0.2 * RATE) - round(0.005 * RATE))


def test_a_failed_job_ends_its_stream_with_the_reason(client: redis.Redis) -> None:
    job_id = uuid.uuid4()
    sink = RedisStreamSink(job_id=job_id, client=client)
    sink.chunk(_signal(0.1), RATE)
    sink.fail(code="engine_error", message="It broke.")
    sink.finish()  # too late: the stream has ended
    *_, last = _entries(client, job_id)
    assert last == Failed(code="engine_error", message="It broke.", attempt=1)
    assert len(_entries(client, job_id)) == 2


def test_the_stream_is_bounded(client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("synthesis.streaming.STREAM_MAXLEN", 10)
    job_id = uuid.uuid4()
    sink = RedisStreamSink(job_id=job_id, client=client)
    for _ in range(500):
        sink.chunk(_signal(0.01), RATE)
    assert client.xlen(stream_key(job_id)) < 200  # approximate trimming, but trimmed


def test_redis_trouble_never_fails_the_job() -> None:
    class Down:
        calls = 0

        def pipeline(self, **kwargs: Any) -> Any:
            Down.calls += 1
            raise redis.ConnectionError("down")

    sink = RedisStreamSink(job_id=uuid.uuid4(), client=Down())
    sink.chunk(_signal(0.2), RATE)
    sink.chunk(_signal(0.2), RATE)
    sink.finish()
    assert Down.calls == 1  # gave up after the first failure


def test_a_superseded_attempts_failure_leaves_the_stream_to_its_successor(
    alice: Persona, broker: Any, client: redis.Redis, engine: Any
) -> None:
    """Attempt 1 fails after the job was redelivered to attempt 2: the job and
    its stream belong to attempt 2, so attempt 1 writes no error into it."""
    from synthesis.services.execution import job_claim, job_execute
    from tests.fake_engines import FailingEngine

    job = _job(alice)

    class RedeliveredThenFails(FailingEngine):
        def synthesize(self, **kwargs: Any) -> Any:
            assert job_claim(job_id=job.id, worker="w2") is not None  # attempt 2
            return super().synthesize(**kwargs)

    result = job_execute(job_id=job.id, engine=RedeliveredThenFails(engine), worker="w1")

    assert result["status"] == "failed"
    job.refresh_from_db()
    assert (job.status, job.attempts) == (JobStatus.RUNNING, 2)
    assert _entries(client, job.id) == []


# --- encoders and framing -------------------------------------------------------------


def test_the_streaming_wav_header_decodes_with_the_samples_after_it() -> None:
    pcm = to_s16le(_signal(0.5))
    samples, rate = sf.read(io.BytesIO(wav_stream_header(RATE) + pcm), dtype="int16")
    assert rate == RATE
    assert samples.tobytes() == pcm


def test_opus_is_encoded_as_it_goes() -> None:
    encoder = OpusEncoder(RATE)
    pieces = [encoder.feed(to_s16le(_signal(0.25, seed))) for seed in range(8)]
    pieces.append(encoder.close())
    # libsndfile flushes an Ogg page about every second of audio, not at the end only.
    assert sum(1 for p in pieces[:-1] if p) >= 2
    info = sf.info(io.BytesIO(b"".join(pieces)))
    assert info.subtype == "OPUS"
    assert info.duration == pytest.approx(2.0, abs=0.05)


def test_sse_events_in_chorus_and_openai_shapes() -> None:
    chorus = EventFramer("chorus").audio(b"abc").decode()
    assert chorus == f'event: audio\ndata: {{"audio":"{base64.b64encode(b"abc").decode()}"}}\n\n'
    openai = EventFramer("openai").done({"job_id": "j", "characters": 5})
    payload = json.loads(openai.decode()[len("data: ") :])
    assert payload["type"] == "speech.audio.done"
    assert payload["usage"]["input_tokens"] == 5
    assert payload["job_id"] == "j"


# --- the relay --------------------------------------------------------------------


class FakeClient:
    """Stands for Redis where the events are made up (`_fake_events`)."""


async def fake_client() -> FakeClient:
    return FakeClient()


def _fake_events(*events: Event) -> Any:
    async def events_for(*, job_id: uuid.UUID, client: Any) -> AsyncIterator[Event]:
        for event in events:
            yield event

    return events_for


def _job(persona: Persona) -> Job:
    return job_create(
        tenant=persona.tenant,
        api_key=persona.api_key,
        speech=SpeechRequest(text="Hello there.", stream=True),
    )


def _relay_all(job: Job, sse: EventFramer | None = None, keep: bool = False) -> bytes:
    async def run() -> bytes:
        events = relay_module.stream_events(job=job, client=FakeClient())
        body = relay(job=job, sse=sse, keep_on_disconnect=keep, events=events)
        return b"".join([piece async for piece in body])

    return async_to_sync(run)()


def _relay_first_then_leave(job: Job, keep: bool) -> bytes:
    async def run() -> bytes:
        events = relay_module.stream_events(job=job, client=FakeClient())
        body = relay(job=job, sse=None, keep_on_disconnect=keep, events=events)
        first = await anext(body)
        await body.aclose()  # what the ASGI handler does when the client goes away
        return first

    return async_to_sync(run)()


def test_the_relay_writes_a_wav_header_then_the_chunks(
    alice: Persona, broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pcm = to_s16le(_signal(0.1))
    monkeypatch.setattr(
        relay_module, "job_events", _fake_events(Chunk(pcm, RATE), Chunk(pcm, RATE), Done())
    )
    body = _relay_all(_job(alice))
    assert body == wav_stream_header(RATE) + pcm + pcm


def test_a_client_that_leaves_cancels_and_refunds_the_job(
    alice: Persona, broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pcm = to_s16le(_signal(0.1))
    monkeypatch.setattr(relay_module, "job_events", _fake_events(Chunk(pcm, RATE), Done()))
    job = _job(alice)
    _relay_first_then_leave(job, keep=False)
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    assert LedgerEntry.objects.filter(job=job, kind="refund").count() == 1


def test_a_client_that_leaves_before_the_relay_has_its_redis_client_cancels_the_job(
    alice: Persona, broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Getting the loop's client may wait (closing idle connections after a
    failure): a client gone meanwhile cancels its job as at any other point."""
    waiting = asyncio.Event()

    async def slow_client() -> FakeClient:
        waiting.set()
        await asyncio.sleep(3600)
        return FakeClient()

    monkeypatch.setattr(relay_module, "stream_client", slow_client)
    job = _job(alice)

    async def leave_while_it_waits() -> None:
        body = relay(job=job, sse=None, keep_on_disconnect=False)
        first = asyncio.create_task(anext(body))
        await waiting.wait()
        first.cancel()  # what the ASGI server does when the client goes away
        with pytest.raises(asyncio.CancelledError):
            await first

    async_to_sync(leave_while_it_waits)()
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    assert LedgerEntry.objects.filter(job=job, kind="refund").count() == 1


def test_a_client_that_asked_to_keep_its_job_leaves_it_running(
    alice: Persona, broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pcm = to_s16le(_signal(0.1))
    monkeypatch.setattr(relay_module, "job_events", _fake_events(Chunk(pcm, RATE), Done()))
    job = _job(alice)
    _relay_first_then_leave(job, keep=True)
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED
    assert not LedgerEntry.objects.filter(job=job, kind="refund").exists()


def test_an_sse_stream_ends_with_the_error_of_a_failed_job(
    alice: Persona, broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        relay_module, "job_events", _fake_events(Failed("engine_error", "It broke."))
    )
    body = _relay_all(_job(alice), sse=EventFramer("chorus")).decode()
    assert body.startswith("event: error\n")
    assert json.loads(body.split("data: ")[1])["error"]["code"] == "engine_error"


def test_an_audio_body_of_a_failed_job_is_cut_off(
    alice: Persona, broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        relay_module, "job_events", _fake_events(Failed("engine_error", "It broke."))
    )
    with pytest.raises(relay_module.StreamAborted):
        _relay_all(_job(alice))


def test_reading_notices_a_job_that_ended_without_streaming(
    alice: Persona, broker: Any, client: redis.Redis, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """Cancelled while queued, and the announcement on the stream lost (Redis
    restarted): the row, read between empty reads, still ends the stream."""
    settings.STREAM_ROW_CHECK_S = 0.05
    monkeypatch.setattr(relay_module, "_GRACE_MS", 50)
    job = _job(alice)
    job_cancel(tenant=alice.tenant, job=job)
    client.delete(stream_key(job.id))

    async def first() -> Event:
        reader = await relay_module.stream_client()
        try:
            return await anext(job_events(job_id=job.id, client=reader))
        finally:
            await reader.aclose()

    assert async_to_sync(first)() == Failed("cancelled", job.error_message)


def test_endings_no_worker_streams_are_announced_on_the_stream_at_once(
    alice: Persona, broker: Any, client: redis.Redis, settings: Any
) -> None:
    """A waiting stream reads its job's row only every CHORUS_STREAM_ROW_CHECK_S (10 s,
    a minute here, so that a busy machine cannot blur the two): the endings that
    happen outside a worker are put on the stream instead."""
    settings.STREAM_ROW_CHECK_S = 60
    cancelled = _job(alice)
    job_cancel(tenant=alice.tenant, job=cancelled)
    lost = _job(alice)
    Job.objects.filter(pk=lost.pk).update(status=JobStatus.RUNNING, attempts=MAX_ATTEMPTS)
    assert job_give_up(job_id=lost.pk)

    async def first(job_id: uuid.UUID) -> tuple[Event, float]:
        reader = await relay_module.stream_client()
        started = time.monotonic()
        try:
            return await anext(job_events(job_id=job_id, client=reader)), time.monotonic() - started
        finally:
            await reader.aclose()

    event, waited = async_to_sync(first)(cancelled.id)
    assert event == Failed("cancelled", Job.objects.get(pk=cancelled.pk).error_message)
    assert waited < 30.0  # not the row check, a minute away
    event, waited = async_to_sync(first)(lost.id)
    assert isinstance(event, Failed)
    assert event.code == "worker_lost"
    assert waited < 30.0


def test_a_stream_waits_longer_than_the_redis_clients_default_timeout(
    alice: Persona, broker: Any, client: redis.Redis, settings: Any
) -> None:
    """A job queued behind others sends nothing for a while: the relay's blocking
    read must outlast it (redis-py's asyncio client times a read out after 5 s).
    The row check is a minute away, so the cancel can only come off the stream."""
    settings.STREAM_ROW_CHECK_S = 60
    job = _job(alice)

    async def first_after_a_wait() -> tuple[Event, float]:
        reader = await relay_module.stream_client()
        started = time.monotonic()
        events = job_events(job_id=job.id, client=reader)
        try:

            async def cancel_later() -> None:
                await asyncio.sleep(6.0)
                await sync_to_async(job_cancel)(tenant=alice.tenant, job=job)

            canceller = asyncio.create_task(cancel_later())
            event = await asyncio.wait_for(anext(events), timeout=30)
            await canceller
            return event, time.monotonic() - started
        finally:
            await reader.aclose()

    event, waited = async_to_sync(first_after_a_wait)()

    assert isinstance(event, Failed)
    assert event.code == "cancelled"
    assert waited >= 6.0  # read past the client's 5 s without giving up


def test_reading_notices_a_reader_that_fell_behind(
    client: redis.Redis, alice: Persona, broker: Any
) -> None:
    job = _job(alice)
    client.xadd(stream_key(job.id), {"t": "chunk", "n": 1, "sr": RATE, "pcm": b"\0\0"})

    async def first() -> Event:
        reader = await relay_module.stream_client()
        try:
            return await anext(job_events(job_id=job.id, client=reader))
        finally:
            await reader.aclose()

    event = async_to_sync(first)()
    assert isinstance(event, Failed)
    assert event.code == "stream_lagged"


def _ended_stream(client: redis.Redis) -> uuid.UUID:
    """A job's stream as its worker leaves it: one chunk, then done."""
    job_id = uuid.uuid4()
    sink = _sink(job_id, client, attempt=1)
    sink.chunk(_signal(0.05), RATE)
    sink.finish()
    return job_id


def test_streams_relayed_on_one_event_loop_share_their_redis_connection(
    client: redis.Redis,
) -> None:
    """A connection per stream was a TCP connect, its handshake and redis-py's
    read of its own package metadata: a sixth of a web process's CPU per
    stream. One after another, five streams read on one connection."""
    jobs = [_ended_stream(client) for _ in range(5)]

    async def read_each() -> tuple[list[list[Event]], set[int]]:
        read, connections = [], set()
        for job_id in jobs:
            relay_client = await stream_client()
            read.append([event async for event in job_events(job_id=job_id, client=relay_client)])
            connections.add(await relay_client.client_id())
        await relay_client.aclose()  # the loop ends here
        return read, connections

    read, connections = async_to_sync(read_each)()
    assert read == [_entries(client, job_id) for job_id in jobs]
    assert isinstance(read[0][0], Chunk)
    assert len(connections) == 1


def test_more_streams_than_redis_pys_default_pool_wait_at_once(
    client: redis.Redis, settings: Any
) -> None:
    """Every stream waiting in a blocking read holds a connection of the shared
    pool: 150 of them (redis-py's pools stop at 100 unless told otherwise) all
    get their audio."""
    settings.STREAM_ROW_CHECK_S = 60  # they wait in XREAD, not in row checks
    jobs = [uuid.uuid4() for _ in range(150)]

    async def all_wait_then_read() -> list[list[Event]]:
        relay_client = await stream_client()
        readers = [
            asyncio.create_task(_collect(job_events(job_id=job_id, client=relay_client)))
            for job_id in jobs
        ]
        await asyncio.sleep(0.5)  # every one is in XREAD BLOCK
        for job_id in jobs:
            sink = _sink(job_id, client, attempt=1)
            sink.chunk(_signal(0.02), RATE)
            sink.finish()
        try:
            return await asyncio.wait_for(asyncio.gather(*readers), timeout=30)
        finally:
            await relay_client.aclose()

    read = async_to_sync(all_wait_then_read)()
    written = [_entries(client, job_id) for job_id in jobs]
    client.delete(*[stream_key(job_id) for job_id in jobs])
    assert read == written
    assert all(isinstance(events[-1], Done) for events in read)


async def _collect(events: AsyncIterator[Event]) -> list[Event]:
    return [event async for event in events]


def _blocked_reads(client: redis.Redis) -> set[int]:
    """The connections to this test's Redis database waiting in XREAD BLOCK."""
    db = client.connection_pool.connection_kwargs.get("db", 0)
    return {
        int(each["id"])
        for each in client.client_list()
        if int(each["db"]) == db and each["cmd"] == "xread" and "b" in each["flags"]
    }


def _until(condition: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_read_cancelled_while_it_waits_leaves_nothing_for_the_next_stream(
    client: redis.Redis, settings: Any
) -> None:
    """A client that leaves cancels its relay in the middle of a blocking read.
    That connection is closed, not put back with the read's reply still to come:
    the next stream on the loop reads its own job's audio."""
    settings.STREAM_ROW_CHECK_S = 60  # the waiting read is not ended by a row check
    waiting, other = uuid.uuid4(), _ended_stream(client)

    async def cancel_then_read() -> tuple[set[int], bool, list[Event]]:
        relay_client = await stream_client()
        others = _blocked_reads(client)  # any of another server's on this database
        reader = asyncio.create_task(anext(job_events(job_id=waiting, client=relay_client)))
        assert await sync_to_async(_until)(lambda: len(_blocked_reads(client) - others) == 1)
        blocked = _blocked_reads(client) - others
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        gone = await sync_to_async(_until)(lambda: not blocked & _blocked_reads(client))
        # What the cancelled read was waiting for arrives now.
        client.xadd(stream_key(waiting), {"t": "chunk", "n": 0, "sr": RATE})
        try:
            return (
                blocked,
                gone,
                await asyncio.wait_for(
                    _collect(job_events(job_id=other, client=await stream_client())), timeout=10
                ),
            )
        finally:
            await relay_client.aclose()

    blocked, gone, events = async_to_sync(cancel_then_read)()
    client.delete(stream_key(waiting))
    assert gone, f"the cancelled read's connection {blocked} is still open"
    assert events == _entries(client, other)
    assert isinstance(events[0], Chunk)


def test_after_redis_failed_the_next_stream_does_not_take_an_idle_connection(
    client: redis.Redis,
) -> None:
    """A pooled connection may lead to a server that is gone (a failed-over
    master's host): once a call to Redis failed in this process, the idle
    connections are closed before the next stream reads, and it connects anew."""
    first, second = _ended_stream(client), _ended_stream(client)

    async def read_fail_read() -> tuple[int, int, list[Event]]:
        relay_client = await stream_client()
        [event async for event in job_events(job_id=first, client=relay_client)]
        old_id = await relay_client.client_id()
        note_redis_failure()  # as the rate limiter does when its call fails
        assert await stream_client() is relay_client  # the same pool, its idle ones closed
        try:
            events = [event async for event in job_events(job_id=second, client=relay_client)]
            return old_id, await relay_client.client_id(), events
        finally:
            await relay_client.aclose()

    try:
        old_id, new_id, events = async_to_sync(read_fail_read)()
    finally:
        redis_failures_forget()
    assert events == _entries(client, second)
    assert new_id != old_id
    assert _until(lambda: old_id not in {int(each["id"]) for each in client.client_list()})


def test_a_relay_whose_read_fails_marks_redis_as_failed() -> None:
    """So that the next stream does not take an idle connection of the pool."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    failures = redis_failures()

    async def read() -> None:
        nowhere = aioredis.Redis(port=port, retry=AsyncRetry(NoBackoff(), 0))  # nothing there
        try:
            await anext(job_events(job_id=uuid.uuid4(), client=nowhere))
        finally:
            await nowhere.aclose()

    try:
        with pytest.raises(redis.ConnectionError):
            async_to_sync(read)()
    finally:
        redis_failures_forget()
    assert redis_failures() == failures + 1


def _read_all(job_id: uuid.UUID) -> list[Event]:
    async def run() -> list[Event]:
        reader = await relay_module.stream_client()
        try:
            return [event async for event in job_events(job_id=job_id, client=reader)]
        finally:
            await reader.aclose()

    return async_to_sync(run)()


def _pcm_of(events: list[Event]) -> bytes:
    return b"".join(e.pcm for e in events if isinstance(e, Chunk))


def _sink(job_id: uuid.UUID, client: redis.Redis, attempt: int, **kwargs: Any) -> RedisStreamSink:
    """A sink as a deterministic engine's worker makes it (`synthetic`, `espeak`)."""
    kwargs = {"engine": "synthetic", "deterministic": True, **kwargs}
    return RedisStreamSink(job_id=job_id, client=client, attempt=attempt, **kwargs)


def test_a_restarted_job_continues_the_clients_audio_where_it_was(client: redis.Redis) -> None:
    """A worker died after 0.6 s of audio; the retry streams from its start. The
    reader gets one signal: the retry's audio from the sample it had reached on."""
    job_id = uuid.uuid4()
    signal = _signal(1.5)
    first = _sink(job_id, client, 1)
    for start in range(0, round(0.6 * RATE), 2400):
        first.chunk(signal[start : start + 2400].copy(), RATE)
    retry = _sink(job_id, client, 2)
    for start in range(0, len(signal), 3000):  # other chunk sizes than the first attempt
        retry.chunk(signal[start : start + 3000].copy(), RATE)
        if start == 6000:
            # The first attempt was not dead after all: what it still sends is dropped.
            first.chunk(signal[14400:16800].copy(), RATE)
            first.fail(code="internal_error", message="A superseded attempt's error.")
    retry.finish()

    events = _read_all(job_id)
    assert isinstance(events[-1], Done)
    assert _pcm_of(events) == to_s16le(_fade_ends(signal, RATE))


def test_a_retry_that_catches_up_sends_only_what_is_new(client: redis.Redis) -> None:
    job_id = uuid.uuid4()
    signal = _signal(0.5)
    first = _sink(job_id, client, 1)
    first.chunk(signal[:6000].copy(), RATE)
    retry = _sink(job_id, client, 2)
    retry.chunk(signal[:2400].copy(), RATE)  # all of it already sent: nothing to relay
    retry.chunk(signal[2400:].copy(), RATE)
    retry.finish()

    events = _read_all(job_id)
    chunks = [e for e in events if isinstance(e, Chunk)]
    sent_first = len(to_s16le(signal[:6000])) - 2 * round(0.005 * RATE)  # 5 ms held back
    assert len(chunks[0].pcm) == sent_first
    assert len(chunks) == 3  # the first attempt's chunk, the rest of the retry's, its tail
    assert _pcm_of(events) == to_s16le(_fade_ends(signal, RATE))


@pytest.mark.parametrize(
    ("first", "retry", "retry_rate"),
    [
        # cosyvoice2 samples: its retry says other words at other times
        ({"engine": "cosyvoice2", "deterministic": False}, {}, RATE),
        ({}, {"engine": "espeak"}, RATE),  # another engine took the retry
        ({}, {}, 22050),  # the same engine at another rate
    ],
)
def test_a_restart_that_would_not_join_seamlessly_ends_the_stream(
    client: redis.Redis, first: dict[str, Any], retry: dict[str, Any], retry_rate: int
) -> None:
    job_id = uuid.uuid4()
    _sink(job_id, client, 1, **first).chunk(_signal(0.2), RATE)
    _sink(job_id, client, 2, **{**first, **retry}).chunk(_signal(0.4), retry_rate)

    events = _read_all(job_id)
    assert isinstance(events[0], Chunk)
    assert isinstance(events[-1], Failed)
    assert events[-1].code == "stream_restarted"
    assert len(events) == 2


def test_a_non_deterministic_retry_before_any_audio_streams_as_usual(
    client: redis.Redis,
) -> None:
    job_id = uuid.uuid4()
    signal = _signal(0.3)
    nondeterministic = {"engine": "cosyvoice2", "deterministic": False}
    _sink(job_id, client, 1, **nondeterministic).chunk(_signal(0.005), RATE)  # all held back
    retry = _sink(job_id, client, 2, **nondeterministic)
    retry.chunk(signal.copy(), RATE)
    retry.finish()

    events = _read_all(job_id)
    assert isinstance(events[-1], Done)
    assert _pcm_of(events) == to_s16le(_fade_ends(signal, RATE))


# --- /v1/speech with stream ----------------------------------------------------------


def _post_speech(persona: Persona, body: dict[str, Any], **headers: str) -> tuple[Any, bytes]:
    async def run() -> tuple[Any, bytes]:
        response = await AsyncClient().post(
            "/v1/speech",
            body,
            content_type="application/json",
            headers={"Authorization": f"Bearer {persona.key}", **headers},
        )
        if response.streaming:
            return response, b"".join([p async for p in response.streaming_content])
        return response, response.content

    return async_to_sync(run)()


def test_speech_with_stream_answers_with_the_audio(
    alice: Persona, broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pcm = to_s16le(_signal(0.1))
    monkeypatch.setattr(relay_module, "job_events", _fake_events(Chunk(pcm, RATE), Done()))
    monkeypatch.setattr(relay_module, "stream_client", fake_client)
    response, body = _post_speech(alice, {"text": "Hi.", "stream": True, "format": "pcm"})
    assert response.status_code == 200
    assert body == pcm
    job = Job.objects.get(pk=response["X-Job-Id"])
    assert job.stream is True
    assert response["Location"] == f"/v1/speech/{job.id}"
    assert "X-RateLimit-Remaining" in response


def test_speech_with_stream_as_events_ends_with_the_job(
    alice: Persona, broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pcm = to_s16le(_signal(0.1))
    monkeypatch.setattr(relay_module, "job_events", _fake_events(Chunk(pcm, RATE), Done()))
    monkeypatch.setattr(relay_module, "stream_client", fake_client)
    response, body = _post_speech(
        alice, {"text": "Hi.", "stream": True, "format": "pcm"}, Accept="text/event-stream"
    )
    assert response["Content-Type"] == "text/event-stream"
    events = [block for block in body.decode().split("\n\n") if block]
    assert events[0].startswith("event: audio")
    assert events[-1].startswith("event: done")
    done = json.loads(events[-1].split("data: ")[1])
    assert done["job_id"] == response["X-Job-Id"]
    assert done["audio_url"] is None  # the fake worker stored nothing; the job is queued


def test_a_stream_is_refused_like_any_job_before_it_starts(alice: Persona, broker: Any) -> None:
    alice.tenant.plan.max_text_chars = 5
    alice.tenant.plan.save()
    response, _ = _post_speech(
        alice, {"text": "Too long.", "stream": True}, Accept="text/event-stream"
    )
    assert_error(response, 422, "text_too_long")
    assert not Job.objects.exists()


def test_without_stream_speech_still_answers_202(alice: Persona, broker: Any) -> None:
    response, _ = _post_speech(alice, {"text": "Hi."})
    assert response.status_code == 202
    assert Job.objects.get().stream is False
