"""A real worker process on the real upstream CosyVoice2 code (tiny random weights):
uvicorn -> PostgreSQL -> Redis -> `celery worker` with CHORUS_ENGINE=cosyvoice2 -> storage.

The tiny model decodes every text segment to upstream's cap (20 speech tokens of
40 ms per text token), so each job's duration is known from its token count.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile as sf

from synthesis.models import Job, JobStatus
from tenants.models import Plan
from tests.audio_files import audio_file
from tests.conftest import Persona, make_persona
from tests.e2e.asgi import AsgiServer, asgi_server  # noqa: F401  (a fixture)
from tests.e2e.conftest import WorkerProcess
from tests.upstream_cosyvoice import SECONDS_PER_TEXT_TOKEN, tiny_model_dir, upstream_src

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

TEXT = "Hello from the real model."
LONG = (
    "This job is long enough that the model is still decoding when the tenant cancels it, "
    "many seconds before it would end on its own, so the worker must stop it at once."
)


@pytest.fixture
def stack(
    start_worker: Callable[..., WorkerProcess],
    asgi_server: Callable[..., AsgiServer],  # noqa: F811
    plan: Plan,
) -> Iterator[tuple[WorkerProcess, Persona, httpx.Client]]:
    engine_env = {
        "CHORUS_ENGINE": "cosyvoice2",
        "CHORUS_ENGINE_OPTIONS": "{}",
        "COSYVOICE_MODEL_DIR": str(tiny_model_dir()),
        "COSYVOICE_SRC": str(upstream_src()),
        # A named card: calibrating this worker's CPU is tests/synthesis/calibration's.
        "CHORUS_DEVICE_PROFILE": "t4-cosyvoice2",
    }
    worker = start_worker(env=engine_env, wait=False)
    server = asgi_server(engine_env)  # the web tier checks requests for the same engine
    worker.wait_ready(timeout=240)  # imports torch and upstream, loads, warms up
    persona = make_persona("alice", plan)
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {persona.key}"}, timeout=60
    ) as http:
        yield worker, persona, http


def text_seconds(text: str) -> float:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir() / "CosyVoice-BlankEN")
    return len(tokenizer(text)["input_ids"]) * SECONDS_PER_TEXT_TOKEN


def upload_voice(http: httpx.Client) -> str:
    response = http.post(
        "/v1/voices",
        data={"name": "narrator", "transcript": "A reference recording.", "language": "en"},
        files={"audio": ("narrator.wav", audio_file(3.0, 24000), "audio/wav")},
    )
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def finished(http: httpx.Client, job_id: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = http.get(f"/v1/speech/{job_id}").json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return dict(job)
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} unfinished after {timeout} s")


def stored(job: dict[str, Any]) -> tuple[np.ndarray, int]:
    data = httpx.get(job["audio_url"], timeout=30).content
    if job["format"] == "pcm":
        return np.frombuffer(data, dtype="<i2"), int(job["sample_rate"])
    samples, rate = sf.read(io.BytesIO(data), dtype="float32")
    return samples, rate


def test_a_real_worker_speaks_wav_and_instructed_mp3_at_another_speed_and_rate(
    stack: tuple[WorkerProcess, Persona, httpx.Client],
) -> None:
    worker, _, http = stack
    voice = upload_voice(http)
    response = http.post("/v1/speech", json={"text": TEXT, "voice_id": voice})
    assert response.status_code == 202, response.text
    job = finished(http, response.json()["id"])
    assert job["status"] == "succeeded", job
    assert job["engine"] == "cosyvoice2"
    samples, rate = stored(job)
    assert rate == 24000
    assert len(samples) / rate == pytest.approx(text_seconds(TEXT), abs=0.05)

    response = http.post(
        "/v1/speech",
        json={
            "text": TEXT,
            "voice_id": voice,
            "format": "mp3",
            "speed": 1.5,
            "sample_rate": 16000,
            "instruction": "Speak cheerfully.",
        },
    )
    job = finished(http, response.json()["id"])
    assert job["status"] == "succeeded", job
    samples, rate = stored(job)
    assert rate == 16000
    assert len(samples) / rate == pytest.approx(text_seconds(TEXT) / 1.5, abs=0.1)
    # Tenants' text never reaches the worker's log (upstream logs each segment).
    assert not any("real model" in line for line in worker.lines)


def test_pcm_streams_from_a_real_worker_and_matches_the_stored_file(
    stack: tuple[WorkerProcess, Persona, httpx.Client],
) -> None:
    _, _, http = stack
    voice = upload_voice(http)
    for _ in range(2):  # the second stream on the same model instance, too
        pieces: list[bytes] = []
        with http.stream(
            "POST",
            "/v1/speech",
            json={"text": TEXT, "voice_id": voice, "stream": True, "format": "pcm"},
        ) as response:
            assert response.status_code == 200
            job_id = response.headers["X-Job-Id"]
            pieces.extend(response.iter_bytes())
        streamed = np.frombuffer(b"".join(pieces), dtype="<i2")
        job = finished(http, job_id)
        samples, rate = stored(job)
        assert len(streamed) == len(samples)
        assert len(samples) / rate == pytest.approx(text_seconds(TEXT), abs=0.05)
        assert job["timings"]["first_audio_s"] < job["timings"]["total_s"]


def test_a_cancelled_job_frees_the_worker_for_the_next_one_at_once(
    stack: tuple[WorkerProcess, Persona, httpx.Client],
) -> None:
    _, _, http = stack
    voice = upload_voice(http)
    assert text_seconds(LONG) > 60  # minutes of decoding on this CPU if left running
    long_id = http.post("/v1/speech", json={"text": LONG, "voice_id": voice}).json()["id"]
    deadline = time.monotonic() + 60
    while not Job.objects.filter(pk=long_id, first_audio_at__isnull=False).exists():
        assert time.monotonic() < deadline, "the long job never produced audio"
        time.sleep(0.05)
    cancelled_at = time.monotonic()
    assert http.post(f"/v1/speech/{long_id}/cancel").status_code == 200
    short_id = http.post("/v1/speech", json={"text": TEXT, "voice_id": voice}).json()["id"]
    short = finished(http, short_id)
    assert short["status"] == "succeeded", short
    assert Job.objects.get(pk=long_id).status == JobStatus.CANCELLED
    # The worker stopped decoding the cancelled text (the next chunk boundary is at
    # most 100 tokens away) and served the short job at its usual speed.
    assert time.monotonic() - cancelled_at < 10 + short["timings"]["total_s"]
    assert short["timings"]["first_audio_s"] < 5
