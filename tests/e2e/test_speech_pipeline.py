"""The whole path, for real: HTTP → PostgreSQL → Redis → worker process →
storage → signed link → audio that decodes to the expected length."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import soundfile as sf

from synthesis.models import Job, WorkerHeartbeat
from tests.audio_files import audio_file
from tests.e2e.conftest import SYNTHETIC, HttpCaller, WorkerProcess, use_s3, wait_for_job

pytestmark = [pytest.mark.e2e, pytest.mark.embedded, pytest.mark.django_db(transaction=True)]

TEXT = "Chorus keeps first audio fast for everyone."


def _upload_voice(caller: HttpCaller) -> dict[str, Any]:
    response = caller.http.post(
        "/v1/voices",
        data={"name": "narrator", "transcript": "A reference recording.", "language": "en"},
        files={"audio": ("narrator.flac", audio_file(4.0, 24000, format="FLAC"), "audio/flac")},
    )
    assert response.status_code == 201, response.text
    return response.json()


def _speak(caller: HttpCaller, **body: Any) -> dict[str, Any]:
    response = caller.http.post("/v1/speech", json={"text": TEXT, **body})
    assert response.status_code == 202, response.text
    assert response.headers["Location"].endswith(f"/v1/speech/{response.json()['id']}")
    return response.json()


def _download(url: str) -> tuple[bytes, Any]:
    # No API key: the signed link alone must be enough for an end customer.
    response = httpx.get(url, timeout=30)
    assert response.status_code == 200, response.text
    return response.content, sf.info(io.BytesIO(response.content))


def _assert_synthetic_audio(job: dict[str, Any], data: bytes, info: Any) -> None:
    expected = len(TEXT) * SYNTHETIC["seconds_per_char"]
    assert info.format == "WAV"
    assert info.samplerate == job["sample_rate"] == 24000
    assert info.duration == pytest.approx(expected, rel=0.01)
    assert job["duration_s"] == pytest.approx(info.duration, abs=0.002)
    assert job["output_bytes"] == len(data)
    timings = job["timings"]
    # As times: an ISO string has no fraction at a whole second, so it does not sort.
    at = {
        name: datetime.fromisoformat(timings[name])
        for name in ("queued_at", "started_at", "first_audio_at", "finished_at")
    }
    assert at["queued_at"] <= at["started_at"] <= at["first_audio_at"] <= at["finished_at"]
    # The engine's own first-chunk delay is a floor for first audio.
    assert timings["first_audio_s"] >= SYNTHETIC["first_chunk_delay_s"] * 0.9


def test_a_job_flows_through_a_real_worker_into_local_storage(
    start_worker: Callable[..., WorkerProcess], http_caller: Callable[[str], HttpCaller]
) -> None:
    start_worker()
    alice = http_caller("alice")
    voice = _upload_voice(alice)

    job = wait_for_job(alice.http, _speak(alice, voice_id=voice["id"], priority="high")["id"])

    assert job["status"] == "succeeded", job
    assert job["engine"] == "synthetic"
    assert "/v1/files/chorus-alice/speech/" in job["audio_url"]
    data, info = _download(job["audio_url"])
    _assert_synthetic_audio(job, data, info)


def test_a_job_flows_through_a_real_worker_into_s3(
    start_worker: Callable[..., WorkerProcess],
    http_caller: Callable[[str], HttpCaller],
    s3_endpoint: str,
    settings: Any,
) -> None:
    start_worker(use_s3(settings, s3_endpoint, bucket_prefix="chorus-e2e-"))
    alice = http_caller("alice")
    voice = _upload_voice(alice)

    job = wait_for_job(alice.http, _speak(alice, voice_id=voice["id"])["id"])

    assert job["status"] == "succeeded", job
    assert job["audio_url"].startswith(f"{s3_endpoint}/chorus-e2e-alice/speech/")
    assert "X-Amz-Signature=" in job["audio_url"]
    assert "X-Amz-Expires=3600" in job["audio_url"]
    data, info = _download(job["audio_url"])
    _assert_synthetic_audio(job, data, info)


def test_the_default_espeak_engine_speaks_through_a_real_worker(
    start_worker: Callable[..., WorkerProcess], http_caller: Callable[[str], HttpCaller]
) -> None:
    start_worker({"CHORUS_ENGINE": "espeak", "CHORUS_ENGINE_OPTIONS": ""})
    alice = http_caller("alice")

    job = wait_for_job(alice.http, _speak(alice)["id"])

    assert job["status"] == "succeeded", job
    assert job["engine"] == "espeak"
    data, info = _download(job["audio_url"])
    assert info.samplerate == 22050
    # Real speech of a 44-character sentence lasts a couple of seconds.
    assert 1.5 < info.duration < 6.0
    assert job["duration_s"] == pytest.approx(info.duration, abs=0.002)
    samples, _ = sf.read(io.BytesIO(data), dtype="float32")
    assert abs(samples).max() > 0.05  # not silence


def test_a_worker_takes_high_before_queued_normal_and_low_work(
    start_worker: Callable[..., WorkerProcess], http_caller: Callable[[str], HttpCaller]
) -> None:
    alice = http_caller("alice")
    # Queue work while no worker runs, lowest priority first.
    low = [_speak(alice, priority="low")["id"] for _ in range(3)]
    normal = _speak(alice, priority="normal")["id"]
    high = _speak(alice, priority="high")["id"]

    # One stream at a time: the order jobs are taken in is the order they start
    # (with several, claims taken in order may reach the database a moment apart).
    start_worker({"CHORUS_WORKER_STREAMS": "1"})
    for job_id in [*low, normal, high]:
        assert wait_for_job(alice.http, job_id)["status"] == "succeeded"

    started = {
        str(job.id): job.started_at for job in Job.objects.filter(tenant=alice.persona.tenant)
    }
    assert started[high] < started[normal] < min(started[job_id] for job_id in low)


def test_a_worker_that_cannot_store_fails_the_job_with_a_reason(
    start_worker: Callable[..., WorkerProcess],
    http_caller: Callable[[str], HttpCaller],
) -> None:
    # The worker points at an S3 endpoint where nothing listens.
    start_worker(
        {
            "CHORUS_STORAGE": "s3",
            "S3_ENDPOINT_URL": "http://127.0.0.1:9",
            "S3_ACCESS_KEY_ID": "x",
            "S3_SECRET_ACCESS_KEY": "y",
            "CHORUS_STORAGE_RETRY_WINDOW": "0",  # no store will come: fail without the wait
        }
    )
    alice = http_caller("alice")

    job = wait_for_job(alice.http, _speak(alice)["id"])

    assert job["status"] == "failed"
    assert job["error"]["code"] == "storage_unavailable"
    assert job["audio_url"] is None
    assert json.dumps(job["error"]).count("127.0.0.1") == 0  # no internals leaked to users


def test_a_worker_loads_its_engine_once_at_start_not_per_task(
    start_worker: Callable[..., WorkerProcess], http_caller: Callable[[str], HttpCaller]
) -> None:
    worker = start_worker()
    alice = http_caller("alice")
    for _ in range(3):
        assert wait_for_job(alice.http, _speak(alice)["id"])["status"] == "succeeded"

    loads = [i for i, line in enumerate(worker.lines) if "engine synthetic loaded" in line]
    first_task = next(i for i, line in enumerate(worker.lines) if "received" in line)
    assert len(loads) == 1
    assert loads[0] < first_task


def test_a_worker_reports_its_heartbeat_with_engine_and_jobs_done(
    start_worker: Callable[..., WorkerProcess], http_caller: Callable[[str], HttpCaller]
) -> None:
    start_worker()
    alice = http_caller("alice")
    assert wait_for_job(alice.http, _speak(alice)["id"])["status"] == "succeeded"

    deadline = time.monotonic() + 15
    beat = None
    while time.monotonic() < deadline:
        beat = WorkerHeartbeat.objects.filter(jobs_done__gte=1).first()
        if beat is not None:
            break
        time.sleep(0.5)
    assert beat is not None, "no heartbeat with a finished job"
    assert (beat.engine, beat.device, beat.last_error) == ("synthetic", "emulated:emu0", "")
    assert beat.memory_bytes > 0


def test_a_worker_that_cannot_load_its_engine_stops_and_takes_no_job(
    start_worker: Callable[..., WorkerProcess],
    http_caller: Callable[[str], HttpCaller],
    tmp_path: Path,
) -> None:
    alice = http_caller("alice")
    job_id = _speak(alice)["id"]
    env = {
        "CHORUS_ENGINE": "cosyvoice2",
        "CHORUS_ENGINE_OPTIONS": "",
        "COSYVOICE_MODEL_DIR": str(tmp_path / "no-model-here"),
    }
    worker = start_worker(env, wait=False)

    worker.process.wait(timeout=60)  # the whole worker stops, not just its pool process
    beat = WorkerHeartbeat.objects.get()
    assert "cosyvoice2.yaml" in beat.last_error  # names a missing file
    time.sleep(1)
    assert alice.http.get(f"/v1/speech/{job_id}").json()["status"] == "queued"
