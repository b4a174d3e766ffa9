"""Streaming for real: uvicorn (ASGI) → PostgreSQL → Redis → worker process →
per-job Redis stream → uvicorn → client, and the stored file at the end."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf

from quotas.models import LedgerEntry
from synthesis.audio_out import TARGET_PEAK
from synthesis.engines.synthetic import AMPLITUDE
from synthesis.models import WAITING, Job, JobStatus
from tenants.models import Plan
from tests.conftest import Persona, make_persona
from tests.e2e.asgi import AsgiServer, asgi_server  # noqa: F401  (a fixture)
from tests.e2e.conftest import SYNTHETIC, WorkerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.embedded, pytest.mark.django_db(transaction=True)]

# Slow enough that a job lasts a while (3 s of audio at rtf 0.4: about 1.2 s),
# so "before the job finishes" means something.
SLOW = {**SYNTHETIC, "rtf": 0.4, "chunk_s": 0.25}
TEXT = "Streaming sends audio while the rest is made."  # 45 chars: 2.25 s of audio


@pytest.fixture
def stack(
    start_worker: Callable[..., WorkerProcess],
    asgi_server: Callable[..., AsgiServer],  # noqa: F811
    plan: Plan,
    tmp_path: Any,
) -> Iterator[tuple[AsgiServer, Persona, httpx.Client]]:
    start_worker(
        env={"CHORUS_ENGINE_OPTIONS": json.dumps({**SLOW, "state_dir": str(tmp_path / "gpu")})}
    )
    server = asgi_server()
    persona = make_persona("alice", plan)
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {persona.key}"}, timeout=30
    ) as http:
        yield server, persona, http


def _stored_samples(http: httpx.Client, job_id: str) -> tuple[np.ndarray, int, dict[str, Any]]:
    job = http.get(f"/v1/speech/{job_id}").json()
    assert job["status"] == "succeeded", job
    data = httpx.get(job["audio_url"], timeout=30).content
    if job["format"] == "pcm":
        return np.frombuffer(data, dtype="<i2"), job["sample_rate"], job
    samples, rate = sf.read(io.BytesIO(data), dtype="int16")
    return samples, rate, job


def _assert_same_audio(streamed: np.ndarray, stored: np.ndarray) -> None:
    """The same signal: the stored file is the stream times its peak-normalizing gain."""
    assert len(streamed) == len(stored)
    s = streamed.astype(np.float64)
    t = stored.astype(np.float64)
    gain = float(np.dot(s, t) / np.dot(s, s))
    assert gain == pytest.approx(TARGET_PEAK / AMPLITUDE, rel=0.01)
    # Both were rounded to int16 once: the difference is quantization, no more.
    assert np.max(np.abs(s * gain - t)) <= gain + 1


def test_chunks_arrive_before_the_job_finishes_and_decode_to_the_stored_file(
    stack: tuple[AsgiServer, Persona, httpx.Client],
) -> None:
    _, _, http = stack
    pieces: list[tuple[datetime, bytes]] = []
    with http.stream("POST", "/v1/speech", json={"text": TEXT, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"] == "audio/wav"
        job_id = response.headers["X-Job-Id"]
        assert response.headers["Location"].endswith(f"/v1/speech/{job_id}")
        for piece in response.iter_raw():
            pieces.append((datetime.now(UTC), piece))

    body = b"".join(piece for _, piece in pieces)
    samples, rate, job = _stored_samples(http, job_id)
    # The header's sizes say "unknown length"; the samples follow it.
    assert body[:4] == b"RIFF"
    assert body[4:8] == b"\xff\xff\xff\xff"
    assert int.from_bytes(body[24:28], "little") == rate == 24000
    streamed = np.frombuffer(body[44:], dtype="<i2")
    _assert_same_audio(streamed, samples)

    first_at = pieces[0][0]
    finished_at = datetime.fromisoformat(job["timings"]["finished_at"])
    assert first_at < finished_at
    assert (finished_at - first_at).total_seconds() > 0.5  # well before, not a photo finish
    assert len(pieces) > 3  # several chunks, not one body
    assert job["characters"] == len(TEXT)
    assert LedgerEntry.objects.filter(job_id=job_id, kind="commit").count() == 1


def test_pcm_streams_raw_samples(stack: tuple[AsgiServer, Persona, httpx.Client]) -> None:
    _, _, http = stack
    response = http.post("/v1/speech", json={"text": TEXT, "stream": True, "format": "pcm"})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/octet-stream"
    stored = np.frombuffer(
        httpx.get(
            http.get(f"/v1/speech/{response.headers['X-Job-Id']}").json()["audio_url"]
        ).content,
        dtype="<i2",
    )
    _assert_same_audio(np.frombuffer(response.content, dtype="<i2"), stored)


def test_sse_sends_base64_audio_then_the_job_and_its_link(
    stack: tuple[AsgiServer, Persona, httpx.Client],
) -> None:
    _, _, http = stack
    events: list[tuple[str, dict[str, Any]]] = []
    with http.stream(
        "POST",
        "/v1/speech",
        json={"text": TEXT, "stream": True, "format": "pcm"},
        headers={"Accept": "text/event-stream"},
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        name = ""
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                events.append((name, json.loads(line[6:])))

    assert [n for n, _ in events[:-1]] == ["audio"] * (len(events) - 1)
    name, done = events[-1]
    assert name == "done"
    assert done["status"] == "succeeded"
    assert done["format"] == "pcm"
    pcm = b"".join(base64.b64decode(e["audio"]) for _, e in events[:-1])
    stored = httpx.get(done["audio_url"], timeout=30)
    assert stored.status_code == 200
    _assert_same_audio(np.frombuffer(pcm, "<i2"), np.frombuffer(stored.content, "<i2"))
    assert Job.objects.get(pk=done["job_id"]).stream is True


def test_a_stream_survives_its_worker_being_killed(
    stack: tuple[AsgiServer, Persona, httpx.Client],
    start_worker: Callable[..., WorkerProcess],
    tmp_path: Any,
) -> None:
    """SIGKILL the worker mid-stream and start it again, as a supervisor would:
    the new process requeues the job (attempt 2) and the client's audio goes on
    from where it was, to the same signal as the file."""
    _, _, http = stack
    body = b""
    with http.stream(
        "POST", "/v1/speech", json={"text": TEXT, "stream": True, "format": "pcm"}
    ) as response:
        assert response.status_code == 200
        job_id = response.headers["X-Job-Id"]
        pieces = response.iter_raw()
        body += next(pieces)
        worker = Job.objects.get(pk=job_id).worker
        os.kill(int(worker.rsplit(":", 1)[1]), signal.SIGKILL)
        start_worker(
            env={"CHORUS_ENGINE_OPTIONS": json.dumps({**SLOW, "state_dir": str(tmp_path / "gpu")})}
        )
        for piece in pieces:
            body += piece

    job = Job.objects.get(pk=job_id)
    assert job.status == JobStatus.SUCCEEDED
    assert job.attempts == 2
    assert job.worker != worker
    stored = np.frombuffer(
        httpx.get(http.get(f"/v1/speech/{job_id}").json()["audio_url"]).content, "<i2"
    )
    _assert_same_audio(np.frombuffer(body, dtype="<i2"), stored)
    kinds = sorted(LedgerEntry.objects.filter(job_id=job_id).values_list("kind", flat=True))
    assert kinds == ["commit", "reserve"]


def test_open_streams_hold_no_database_connection(
    start_worker: Callable[..., WorkerProcess],
    asgi_server: Callable[..., AsgiServer],  # noqa: F811
    plan: Plan,
    tmp_path: Any,
) -> None:
    """Four streams on a worker that runs one at a time, while the web tier has a
    pool of two connections: other requests are still answered at once, not
    after the pool's 10 s timeout (each stream used to keep its connection to the
    end). The three that wait read their job rows every 0.2 s here (10 s as
    deployed), so the probes overlap those reads too."""
    start_worker(
        env={
            "CHORUS_ENGINE_OPTIONS": json.dumps({**SLOW, "state_dir": str(tmp_path / "gpu")}),
            "CHORUS_WORKER_STREAMS": "1",
        }
    )
    server = asgi_server({"CHORUS_DB_POOL_SIZE": "2", "CHORUS_STREAM_ROW_CHECK_S": "0.2"})
    persona = make_persona("alice", plan)
    long_text = "Four streams wait here while another request is answered. " * 2
    with (
        httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {persona.key}"}, timeout=30
        ) as http,
        contextlib.ExitStack() as streams,
    ):
        for _ in range(4):
            response = streams.enter_context(
                http.stream("POST", "/v1/speech", json={"text": long_text, "stream": True})
            )
            assert response.status_code == 200
        for _ in range(10):  # about 2 s, while the last three still wait
            started = time.monotonic()
            usage = http.get("/v1/usage")
            assert usage.status_code == 200, usage.text
            assert time.monotonic() - started < 2
            time.sleep(0.2)
        waiting = Job.objects.filter(status__in=WAITING).count()
        assert waiting >= 1, "the streams ended before the probes were done"


def _disconnect_after_first_chunk(http: httpx.Client, **extra: Any) -> str:
    long_text = "A long text that the client will not wait for. " * 5  # 12 s of audio
    with http.stream(
        "POST", "/v1/speech", json={"text": long_text, "stream": True, **extra}
    ) as response:
        assert response.status_code == 200
        job_id = response.headers["X-Job-Id"]
        next(response.iter_raw())
    # Leaving the block closes the connection half-way through the body.
    return job_id


def _wait_status(job_id: str, statuses: tuple[str, ...], timeout: float = 30) -> Job:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = Job.objects.get(pk=job_id)
        if job.status in statuses:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} is still {job.status}")


def test_a_client_that_disconnects_cancels_and_refunds_its_job(
    stack: tuple[AsgiServer, Persona, httpx.Client],
) -> None:
    _, _, http = stack
    job_id = _disconnect_after_first_chunk(http)

    job = _wait_status(job_id, ("cancelled", "succeeded", "failed"))
    assert job.status == JobStatus.CANCELLED
    kinds = sorted(LedgerEntry.objects.filter(job_id=job_id).values_list("kind", flat=True))
    assert kinds == ["refund", "reserve"]


def test_keep_on_disconnect_finishes_and_charges_the_job(
    stack: tuple[AsgiServer, Persona, httpx.Client],
) -> None:
    _, _, http = stack
    job_id = _disconnect_after_first_chunk(http, keep_on_disconnect=True)

    job = _wait_status(job_id, ("cancelled", "succeeded", "failed"))
    assert job.status == JobStatus.SUCCEEDED
    kinds = sorted(LedgerEntry.objects.filter(job_id=job_id).values_list("kind", flat=True))
    assert kinds == ["commit", "reserve"]


def test_limits_are_checked_before_streaming_starts(
    stack: tuple[AsgiServer, Persona, httpx.Client], plan: Plan
) -> None:
    _, persona, http = stack
    plan.max_text_chars = 20
    plan.allowed_priorities = ["normal", "low"]
    plan.save()

    too_long = http.post(
        "/v1/speech",
        json={"text": "x" * 21, "stream": True},
        headers={"Accept": "text/event-stream"},
    )
    assert too_long.status_code == 422
    assert too_long.headers["content-type"] == "application/json"
    assert too_long.json()["error"]["code"] == "text_too_long"

    high = http.post("/v1/speech", json={"text": "hi", "stream": True, "priority": "high"})
    assert high.status_code == 403
    assert high.json()["error"]["code"] == "priority_not_allowed"
    assert not Job.objects.filter(tenant=persona.tenant).exists()


# --- the official openai package, unchanged -----------------------------------------


@pytest.fixture
def openai_client(stack: tuple[AsgiServer, Persona, httpx.Client]) -> openai.OpenAI:
    server, persona, _ = stack
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=persona.key, max_retries=0)


def test_the_openai_package_creates_speech(
    openai_client: openai.OpenAI, stack: tuple[AsgiServer, Persona, httpx.Client]
) -> None:
    _, _, http = stack
    response = openai_client.audio.speech.create(
        model="tts-1", voice="alloy", input=TEXT, response_format="wav"
    )
    data = response.read()
    assert data[:4] == b"RIFF"
    job_id = response.response.headers["X-Job-Id"]
    stored, _rate, job = _stored_samples(http, job_id)
    _assert_same_audio(np.frombuffer(data[44:], "<i2"), stored)
    assert job["voice_id"] is None

    mp3 = openai_client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT)
    info = sf.info(io.BytesIO(mp3.read()))
    assert info.format == "MP3"


def test_the_openai_package_streams_speech(
    openai_client: openai.OpenAI, stack: tuple[AsgiServer, Persona, httpx.Client]
) -> None:
    _, _, http = stack
    arrivals: list[float] = []
    body = bytearray()
    started = time.monotonic()
    with openai_client.audio.speech.with_streaming_response.create(
        model="gpt-4o-mini-tts",
        voice="alloy",
        input=TEXT,
        response_format="pcm",
        instructions="Calm and slow.",
    ) as response:
        job_id = response.headers["X-Job-Id"]
        for piece in response.iter_bytes():
            arrivals.append(time.monotonic() - started)
            body.extend(piece)
    assert len(arrivals) > 3
    assert arrivals[0] < arrivals[-1] - 0.5  # audio came while the job was still running
    job = Job.objects.get(pk=job_id)
    assert job.instruction == "Calm and slow."
    stored, _, _ = _stored_samples(http, job_id)
    _assert_same_audio(np.frombuffer(bytes(body), "<i2"), stored)


def test_the_openai_package_streams_sse(
    openai_client: openai.OpenAI, stack: tuple[AsgiServer, Persona, httpx.Client]
) -> None:
    with openai_client.audio.speech.with_streaming_response.create(
        model="gpt-4o-mini-tts",
        voice="alloy",
        input=TEXT,
        response_format="pcm",
        stream_format="sse",
    ) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    events = [json.loads(line[6:]) for line in lines]
    assert {e["type"] for e in events[:-1]} == {"speech.audio.delta"}
    done = events[-1]
    assert done["type"] == "speech.audio.done"
    assert done["usage"]["input_tokens"] == len(TEXT)
    assert done["audio_url"]
    assert done["job_id"]


def test_the_openai_package_sees_errors_in_the_envelope(openai_client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as not_found:
        openai_client.audio.speech.create(model="tts-1", voice="no-such-voice", input=TEXT)
    assert not_found.value.body["code"] == "not_found"  # type: ignore[index]

    with pytest.raises(openai.BadRequestError) as refused:
        openai_client.audio.speech.create(
            model="tts-1", voice="alloy", input=TEXT, response_format="aac"
        )
    assert refused.value.body["details"]["field"] == "response_format"  # type: ignore[index]
