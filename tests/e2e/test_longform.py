"""Long-form jobs for real: uvicorn, PostgreSQL, Redis, GPU worker processes on
the synthetic engine (emulated devices; no GPU here), and a CPU worker on the
`light` queue that joins the segments."""

from __future__ import annotations

import io
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import httpx
import numpy as np
import pytest
import soundfile as sf

from quotas.models import LedgerEntry
from synthesis.longform.split import PAUSE_S
from synthesis.models import Job, JobStatus
from synthesis.provenance import sidecar_key
from synthesis.services.jobs import job_create
from synthesis.speech_request import SpeechRequest
from tenants.models import Plan
from tests.conftest import Persona, make_persona
from tests.e2e.asgi import AsgiServer, asgi_server  # noqa: F401  (a fixture)
from tests.e2e.conftest import SYNTHETIC, WorkerProcess, use_s3

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SENTENCES = [
    "The lighthouse keeper climbed the stairs at dusk.",
    "He lit the lamp, e.g. with a long match, as his father had.",
    "Ships passed far out, their lights small and slow.",
    "By midnight the wind had turned to the north.",
]
TEXT = " ".join(SENTENCES * 6)  # ~1,200 characters: 6 or more segments


def _options(tmp_path: Any, device: str, **timing: float) -> str:
    return json.dumps({**SYNTHETIC, **timing, "device": device, "state_dir": str(tmp_path / "gpu")})


def start_light_worker(
    start_worker: Callable[..., WorkerProcess], tmp_path: Any, env: dict[str, str] | None = None
) -> WorkerProcess:
    """The CPU worker that splits and joins. It needs no engine; the worker process
    loads one anyway, so it gets an emulated device of its own, not a GPU's memory."""
    options = {"CHORUS_ENGINE_OPTIONS": _options(tmp_path, "light")}
    return start_worker({**(env or {}), **options}, queues="light")


@pytest.fixture
def longform_plan(plan: Plan) -> Plan:
    plan.max_longform_chars = 20_000
    plan.save()
    return plan


@pytest.fixture
def stack(
    start_worker: Callable[..., WorkerProcess],
    asgi_server: Callable[..., AsgiServer],  # noqa: F811
    longform_plan: Plan,
    tmp_path: Any,
) -> Iterator[tuple[Persona, httpx.Client]]:
    for device in ("emu0", "emu1"):  # two emulated GPUs, one worker each
        start_worker(
            env={
                "CHORUS_ENGINE_OPTIONS": _options(tmp_path, device),
                "CHORUS_WORKER_STREAMS": "2",
            },
            wait=False,
        )
    start_light_worker(start_worker, tmp_path)
    server = asgi_server()
    persona = make_persona("alice", longform_plan)
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {persona.key}"}, timeout=60
    ) as http:
        yield persona, http


def wait_finished(http: httpx.Client, job_id: str, timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = http.get(f"/v1/speech/{job_id}").json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} still {job['status']}: {job['progress']}")


def segments_of(job_id: str) -> list[Job]:
    return list(Job.objects.filter(parent_id=job_id).order_by("segment_index"))


def test_a_long_text_runs_on_several_workers_and_comes_back_as_one_file(
    stack: tuple[Persona, httpx.Client],
) -> None:
    _persona, http = stack

    submitted = http.post("/v1/speech", json={"text": TEXT, "format": "flac"})

    assert submitted.status_code == 202, submitted.text
    job = wait_finished(http, submitted.json()["id"])
    assert job["status"] == "succeeded", job
    segments = segments_of(job["id"])
    assert job["progress"]["segments_done"] == job["progress"]["segments_total"] == len(segments)
    assert {s.status for s in segments} == {JobStatus.SUCCEEDED}
    assert len({s.worker for s in segments}) == 2  # both GPUs took segments
    audio, rate = sf.read(io.BytesIO(httpx.get(job["audio_url"]).content), dtype="float32")
    expected = sum(s.duration_s for s in segments) + PAUSE_S * (len(segments) - 1)
    assert len(audio) / rate == pytest.approx(expected, abs=0.01)
    assert job["duration_s"] == pytest.approx(len(audio) / rate, abs=0.01)
    # Charged once, for the whole text, on the job the tenant sees.
    ledger = sorted(LedgerEntry.objects.values_list("job_id", "kind", "characters"))
    parent = Job.objects.get(pk=job["id"]).pk
    assert ledger == [(parent, "commit", len(TEXT)), (parent, "reserve", len(TEXT))]
    assert [j["id"] for j in http.get("/v1/speech").json()["results"]] == [job["id"]]
    assert http.get("/v1/usage").json()["characters"]["used"] == len(TEXT)


def test_a_streamed_long_text_plays_every_segment_in_order_then_the_stored_file(
    stack: tuple[Persona, httpx.Client],
) -> None:
    _persona, http = stack

    with http.stream(
        "POST", "/v1/speech", json={"text": TEXT, "stream": True, "format": "wav"}
    ) as response:
        assert response.status_code == 200
        job_id = response.headers["X-Job-Id"]
        body = b"".join(response.iter_bytes())

    streamed = np.frombuffer(body[44:], dtype="<i2").astype(np.float32) / 32767
    job = wait_finished(http, job_id)
    assert job["status"] == "succeeded", job
    stored, rate = sf.read(io.BytesIO(httpx.get(job["audio_url"]).content), dtype="float32")
    # The same samples in the same order: each segment's stretch of the stream is
    # that segment's stretch of the file, up to the file's gains (one per
    # segment's peak, one for the whole).
    assert len(streamed) == len(stored)
    at = 0
    pause = round(PAUSE_S * rate)
    for segment in segments_of(job_id):
        length = round(segment.duration_s * rate)
        a, b = streamed[at : at + length], stored[at : at + length]
        correlation = float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))
        assert correlation > 0.999, (segment.segment_index, correlation)
        at += length + pause


def _waiting_for(job_id: str, worker: WorkerProcess) -> str:
    """What a long text that did not finish is waiting for: its segments and the
    worker's last lines."""
    segments = [
        f"{s.segment_index} {s.status} attempt {s.attempts} epoch {s.epoch} "
        f"published {s.published_at} on {s.worker or '-'}"
        for s in segments_of(job_id)
    ]
    return "\n".join([*segments, "".join(worker.lines[-60:])])


def test_a_worker_killed_mid_segment_redoes_only_that_segment(
    start_worker: Callable[..., WorkerProcess], longform_plan: Plan, tmp_path: Any
) -> None:
    slow = {"rtf": 0.3}
    env = {
        "CHORUS_ENGINE_OPTIONS": _options(tmp_path, "emu0", **slow),
        "CHORUS_WORKER_STREAMS": "1",
    }
    worker = start_worker(env)
    start_light_worker(start_worker, tmp_path)
    persona = make_persona("alice", longform_plan)
    job = job_create(
        tenant=persona.tenant, api_key=persona.api_key, speech=SpeechRequest(text=TEXT)
    )
    deadline = time.monotonic() + 30
    while True:  # kill it while a segment after the first runs
        running = [s for s in segments_of(str(job.pk)) if s.status == JobStatus.RUNNING]
        if running and running[0].segment_index >= 2:
            break
        assert time.monotonic() < deadline, "".join(worker.lines[-40:])
        time.sleep(0.02)
    os.kill(worker.process.pid, signal.SIGKILL)
    killed = running[0].segment_index
    restarted = start_worker(env)  # a supervisor restarts it; it requeues its predecessor's job

    deadline = time.monotonic() + 90
    while Job.objects.get(pk=job.pk).status == JobStatus.RUNNING:
        assert time.monotonic() < deadline, _waiting_for(str(job.pk), restarted)
        time.sleep(0.2)

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, (job.error_code, job.error_message)
    attempts = {s.segment_index: s.attempts for s in segments_of(str(job.pk))}
    assert attempts[killed] == 2
    assert len(attempts) == job.segments_total > killed + 1
    assert {n for i, n in attempts.items() if i != killed} == {1}
    kinds = sorted(LedgerEntry.objects.filter(job=job).values_list("kind", "characters"))
    assert kinds == [("commit", len(TEXT)), ("reserve", len(TEXT))]


def test_a_long_text_is_joined_from_s3_and_only_the_joined_file_stays(
    start_worker: Callable[..., WorkerProcess],
    longform_plan: Plan,
    s3_endpoint: str,
    settings: Any,
    tmp_path: Any,
) -> None:
    env = use_s3(settings, s3_endpoint, bucket_prefix="chorus-lf-")
    start_worker({**env, "CHORUS_ENGINE_OPTIONS": _options(tmp_path, "emu0")}, wait=False)
    start_light_worker(start_worker, tmp_path, env)
    persona = make_persona("alice", longform_plan)

    job = job_create(
        tenant=persona.tenant,
        api_key=persona.api_key,
        speech=SpeechRequest(text=TEXT, format="opus"),
    )
    deadline = time.monotonic() + 90
    while Job.objects.get(pk=job.pk).status == JobStatus.RUNNING:
        assert time.monotonic() < deadline
        time.sleep(0.2)

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, (job.error_code, job.error_message)
    assert job.sample_rate == 48000  # opus's rate, resampled from the engine's 24 kHz
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        aws_access_key_id=env["S3_ACCESS_KEY_ID"],
        aws_secret_access_key=env["S3_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    )
    listed = client.list_objects_v2(Bucket=persona.tenant.bucket).get("Contents", [])
    # Segment audio is gone (segments are never signed: no sidecar of theirs is
    # left); the joined opus keeps its Content Credentials beside it.
    assert sorted(o["Key"] for o in listed) == [job.output_key, sidecar_key(job.output_key)]
    body = client.get_object(Bucket=persona.tenant.bucket, Key=job.output_key)["Body"].read()
    audio, rate = sf.read(io.BytesIO(body), dtype="float32")
    segments = segments_of(str(job.pk))
    expected = sum(s.duration_s for s in segments) + PAUSE_S * (len(segments) - 1)
    assert len(audio) / rate == pytest.approx(expected, abs=0.05)
