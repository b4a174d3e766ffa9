"""The live stream's wire format: every event written through Redis reads back
as itself, and an entry this reader cannot read says why."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync

from chorus.redis_client import get_redis
from synthesis.api import streaming as relay_module
from synthesis.stream_protocol import (
    PROTOCOL_VERSION,
    Chunk,
    Done,
    Event,
    Failed,
    StreamProtocolError,
    Timing,
    decode,
    encode,
)
from synthesis.streaming import stream_key


@pytest.fixture
def client() -> redis.Redis:
    connection = get_redis()
    assert connection is not None, "tests need REDIS_URL"
    return connection


def _through_redis(client: redis.Redis, fields: dict[str, Any]) -> dict[bytes, bytes]:
    """The entry as a reader gets it back from Redis (bytes keys and values)."""
    key = stream_key(uuid.uuid4())
    client.xadd(key, fields)
    ((_, read),) = client.xrange(key)
    client.delete(key)
    return read


@pytest.mark.parametrize(
    "event",
    [
        Chunk(pcm=b"\x01\x00\xff\x7f", sample_rate=24000, sequence=3, attempt=2),
        Chunk(pcm=b"\0\0", sample_rate=22050, engine="espeak", deterministic=True),
        Chunk(
            pcm=b"\0\0" * 10,
            sample_rate=24000,
            attempt=1,
            alignment=(Timing("Hello", 0.0, 0.31), Timing("world", 0.35, 0.7)),
        ),
        Chunk(pcm=b"\0\0", sample_rate=24000, alignment=()),
        Done(attempt=1, job_id="6f052fb8-718f-4662-b037-618fe6e319a2"),
        Done(job_id="j"),  # announced by the web tier: no attempt
        Failed(code="engine_error", message="It broke: ünïcode.", attempt=3),
        Failed(code="cancelled", message="The job was cancelled."),
    ],
    ids=repr,
)
def test_every_event_reads_back_as_itself(client: redis.Redis, event: Event) -> None:
    fields = encode(event)
    assert fields["v"] == PROTOCOL_VERSION
    assert decode(_through_redis(client, fields)) == event


def test_an_entry_from_before_the_version_field_reads_as_version_one(
    client: redis.Redis,
) -> None:
    old = {"t": "chunk", "a": 2, "n": 0, "sr": 24000, "e": "synthetic", "d": 1, "pcm": b"\0\0"}
    assert decode(_through_redis(client, old)) == Chunk(
        pcm=b"\0\0", sample_rate=24000, attempt=2, engine="synthetic", deterministic=True
    )


def test_an_entry_of_another_version_is_refused_by_name(client: redis.Redis) -> None:
    newer = {**encode(Done(job_id="j")), "v": PROTOCOL_VERSION + 1}
    with pytest.raises(StreamProtocolError, match=rf"version {PROTOCOL_VERSION + 1} is not"):
        decode(_through_redis(client, newer))


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"v": 1, "t": "chunk", "n": 0, "sr": 24000}, "lacks its 'pcm' field"),
        ({"v": 1, "t": "chunk", "n": "x", "sr": 24000, "pcm": b""}, "'n' is not an integer"),
        ({"v": 1, "t": "error", "code": "c"}, "lacks its 'message' field"),
        ({"v": 1, "t": "mystery"}, "unknown type"),
        ({"t": "done"} | {"v": "one"}, "'v' is not an integer"),
        ({"v": 1, "t": "error", "code": b"\xff", "message": "m"}, "not UTF-8"),
        (
            {"v": 1, "t": "chunk", "n": 0, "sr": 24000, "pcm": b"", "al": "[[1]]"},
            "alignment is malformed",
        ),
    ],
)
def test_a_malformed_entry_says_what_is_wrong(
    client: redis.Redis, fields: dict[str, Any], says: str
) -> None:
    with pytest.raises(StreamProtocolError, match=says):
        decode(_through_redis(client, fields))


def test_a_relay_ends_a_stream_it_cannot_read_with_a_clear_error(client: redis.Redis) -> None:
    """A worker of a newer release wrote a chunk this web process cannot read:
    the client gets an error it can act on, not a server error mid-body."""
    job_id = uuid.uuid4()
    client.xadd(stream_key(job_id), {"v": 2, "t": "chunk", "seq": 0, "sr": 24000, "pcm": b"\0"})

    async def first() -> Event:
        reader = await relay_module.stream_client()
        try:
            return await anext(relay_module.job_events(job_id=job_id, client=reader))
        finally:
            await reader.aclose()

    event = async_to_sync(first)()
    client.delete(stream_key(job_id))
    assert isinstance(event, Failed)
    assert event.code == "stream_unreadable"
