"""A stream cut by its job's failure, under the real web server: the client's
transfer ends without its final chunk, and the server logs one line with the job
and the code, not uvicorn's "Exception in ASGI application" with a traceback.

No worker runs: the test writes the job's live stream itself (audio, then the
engine's failure), as a worker's sink would."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx
import pytest
import redis

from synthesis.stream_protocol import Chunk, Event, Failed, encode
from synthesis.streaming import stream_key
from tenants.models import Plan
from tests.conftest import make_persona
from tests.e2e.asgi import AsgiServer, asgi_server  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.embedded, pytest.mark.django_db(transaction=True)]

FAILURE: list[Event] = [
    Chunk(pcm=b"\x01\x00" * 2400, sample_rate=24000, sequence=0, attempt=1),
    Failed("engine_error", "The engine could not speak this text.", attempt=1),
]


def _write_stream(broker: redis.Redis, job_id: str) -> None:
    for event in FAILURE:
        broker.xadd(stream_key(job_id), encode(event))


def _read_into(response: httpx.Response, received: list[bytes]) -> None:
    received.extend(response.iter_bytes())


def _assert_one_line_and_no_traceback(server: AsgiServer, job_id: str) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any("cut off" in line for line in server.lines):
        time.sleep(0.05)
    time.sleep(0.3)  # anything uvicorn logs after the cut has come by now
    output = "".join(server.lines)
    # (The job's other lines, queued and the request's, name it too.)
    cut = [line for line in server.lines if job_id in line and "engine_error" in line]
    assert len(cut) == 1, output
    assert "Exception in ASGI application" not in output, output
    assert "Traceback" not in output, output


def test_a_native_audio_stream_cut_by_a_failure_logs_one_line_without_a_traceback(
    asgi_server: Callable[..., AsgiServer],  # noqa: F811
    plan: Plan,
    broker: redis.Redis,
) -> None:
    alice = make_persona("alice", plan)
    server = asgi_server()
    headers = {"Authorization": f"Bearer {alice.key}"}
    body = {"text": "A stream that breaks.", "format": "pcm", "stream": True}
    with (
        httpx.Client(base_url=server.url, headers=headers, timeout=30) as http,
        http.stream("POST", "/v1/speech", json=body) as response,
    ):
        assert response.status_code == 200, response.read()
        job_id = response.headers["X-Job-Id"]
        _write_stream(broker, job_id)
        received: list[bytes] = []
        with pytest.raises(httpx.RemoteProtocolError):  # no final chunk: cut off
            _read_into(response, received)
    assert sum(map(len, received)) == 4800
    _assert_one_line_and_no_traceback(server, job_id)


def test_an_openai_audio_stream_cut_by_a_failure_logs_one_line_without_a_traceback(
    asgi_server: Callable[..., AsgiServer],  # noqa: F811
    plan: Plan,
    broker: redis.Redis,
) -> None:
    """The OpenAI-compatible route is an async view (Django's own chain): the same."""
    alice = make_persona("alice", plan)
    server = asgi_server()
    headers = {"Authorization": f"Bearer {alice.key}"}
    found: list[str] = []

    def feed() -> None:
        # That view answers once the first audio is there: find the job, then write.
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as lister:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not found:
                jobs = lister.get("/v1/speech").json()["results"]
                if jobs:
                    found.append(jobs[0]["id"])
                    _write_stream(broker, jobs[0]["id"])
                else:
                    time.sleep(0.05)

    feeder = threading.Thread(target=feed)
    feeder.start()
    body = {"model": "tts-1", "voice": "alloy", "input": "It breaks.", "response_format": "pcm"}
    try:
        with (
            httpx.Client(base_url=server.url, headers=headers, timeout=30) as http,
            http.stream("POST", "/v1/audio/speech", json=body) as response,
        ):
            assert response.status_code == 200, response.read()
            with pytest.raises(httpx.RemoteProtocolError):
                _read_into(response, [])
    finally:
        feeder.join()
    assert found
    _assert_one_line_and_no_traceback(server, found[0])
