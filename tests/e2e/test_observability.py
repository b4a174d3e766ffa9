"""What an operator sees, for real: two uvicorn processes and a Celery worker
process write metrics to one folder; /metrics, parsed with Prometheus's own
parser, counts exactly the jobs that ran; the JSON log lines of both tie a
request to its job through the request id; the probes say when a part is down."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings as django_settings
from prometheus_client.parser import text_string_to_metric_families

from chorus.web_server import web_server_argv
from tenants.models import Plan
from tests.audio_files import audio_file
from tests.conftest import make_persona
from tests.e2e.asgi import AsgiServer, asgi_server, free_port, healthy, server_env  # noqa: F401
from tests.e2e.conftest import ROOT, WorkerProcess, collect_lines, stack_env, wait_for_job
from tests.unreachable import dead_port

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

TOKEN = "e2e-metrics-token"
# Distinctive, so the test can tell it never reached a log line.
TEXTS = {
    "high": "Quietly the harbour lights came on one by one.",
    "normal": "Marmalade skies over the seventh lighthouse.",
    "low": "Nobody counted the blue umbrellas that spring.",
}
GONE_VOICE_TEXT = "A sentence for a voice that will be deleted."

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def two_process_web(tmp_path: Path) -> Iterator[Callable[[dict[str, str]], AsgiServer]]:
    servers: list[AsgiServer] = []

    def start(env: dict[str, str]) -> AsgiServer:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        process = subprocess.Popen(
            web_server_argv(host="127.0.0.1", port=port, workers=2),
            cwd=ROOT,
            env={**env, "CHORUS_PUBLIC_URL": url},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        server = AsgiServer(url=url, process=process)
        servers.append(server)
        threading.Thread(target=collect_lines, args=(process, server.lines), daemon=True).start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert process.poll() is None, "".join(server.lines[-40:])
            if healthy(url):
                return server
            time.sleep(0.2)
        raise AssertionError("uvicorn did not start:\n" + "".join(server.lines[-40:]))

    yield start
    for server in servers:
        server.stop()


def scrape(url: str) -> Samples:
    response = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """Summed over every label not given."""
    return sum(
        v
        for (n, sample_labels), v in samples.items()
        if n == name and labels.items() <= dict(sample_labels).items()
    )


def worker_ready(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "worker_ready"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def json_lines(lines: list[str]) -> list[dict[str, Any]]:
    parsed = []
    for line in lines:
        if line.startswith("{"):
            parsed.append(json.loads(line))
    return parsed


def test_metrics_and_logs_follow_real_jobs_through_two_web_processes_and_a_worker(
    start_worker: Callable[..., WorkerProcess],
    two_process_web: Callable[[dict[str, str]], AsgiServer],
    plan: Plan,
    settings: Any,
    tmp_path: Path,
) -> None:
    metrics_dir = tmp_path / "metrics"
    shared = {
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        "CHORUS_METRICS_TOKEN": TOKEN,
        "CHORUS_LOG_FORMAT": "json",
        "CHORUS_LOG_LEVEL": "INFO",
    }
    web = two_process_web(server_env(settings.STORAGE["local_root"], shared))
    settings.STORAGE = {**settings.STORAGE, "base_url": web.url}
    alice = make_persona("alice", plan)
    http = httpx.Client(
        base_url=web.url, headers={"Authorization": f"Bearer {alice.key}"}, timeout=30
    )
    ready_env = stack_env()
    assert worker_ready(ready_env).returncode == 1  # no worker yet

    # A job whose voice is deleted before any worker runs: it fails with a code.
    voice = http.post(
        "/v1/voices",
        data={"name": "narrator", "transcript": "A reference recording.", "language": "en"},
        files={"audio": ("n.flac", audio_file(4.0, 24000, format="FLAC"), "audio/flac")},
    )
    assert voice.status_code == 201, voice.text
    doomed = http.post("/v1/speech", json={"text": GONE_VOICE_TEXT, "voice_id": voice.json()["id"]})
    assert doomed.status_code == 202, doomed.text
    assert http.delete(f"/v1/voices/{voice.json()['id']}").status_code == 204
    jobs = {}
    for priority, text in TEXTS.items():
        answer = http.post(
            "/v1/speech",
            json={"text": text, "priority": priority},
            headers={"X-Request-Id": f"req-{priority}-1"},
        )
        assert answer.status_code == 202, answer.text
        assert answer.headers["X-Request-Id"] == f"req-{priority}-1"
        jobs[priority] = answer.json()["id"]
    refused = http.post("/v1/speech", json={"text": "Hi.", "fromat": "mp3"})
    assert refused.status_code == 400
    assert re.fullmatch(r"[0-9a-f]{32}", refused.headers["X-Request-Id"])
    # An id with unsafe characters is replaced, not echoed.
    odd = http.get("/v1/usage", headers={"X-Request-Id": "two words\\n"})
    assert re.fullmatch(r"[0-9a-f]{32}", odd.headers["X-Request-Id"])

    worker = start_worker(shared)
    results = {p: wait_for_job(http, job_id) for p, job_id in jobs.items()}
    failed = wait_for_job(http, doomed.json()["id"])
    assert {p: job["status"] for p, job in results.items()} == dict.fromkeys(TEXTS, "succeeded")
    assert (failed["status"], failed["error"]["code"]) == ("failed", "engine_error")
    assert worker_ready(ready_env).returncode == 0

    # The worker counts a job just after its row says so: wait for the last one.
    deadline = time.monotonic() + 10
    while total(scrape(web.url), "chorus_jobs_finished_total") < 4:
        assert time.monotonic() < deadline, "the outcomes never reached /metrics"
        time.sleep(0.1)
    # Every scrape, whichever process answers it, adds up every process's files.
    scrapes = [scrape(web.url) for _ in range(6)]
    for name in ("chorus_jobs_admitted_total", "chorus_jobs_finished_total"):
        assert len({total(s, name) for s in scrapes}) == 1, name
    samples = scrapes[-1]

    assert value(samples, "chorus_jobs_admitted_total", priority="normal") == 2
    assert value(samples, "chorus_jobs_admitted_total", priority="high") == 1
    assert value(samples, "chorus_jobs_admitted_total", priority="low") == 1
    assert value(samples, "chorus_jobs_refused_total", code="unknown_field") == 1
    finished = "chorus_jobs_finished_total"
    for priority in TEXTS:
        assert value(samples, finished, priority=priority, status="succeeded", code="") == 1
    assert value(samples, finished, priority="normal", status="failed", code="engine_error") == 1
    assert total(samples, finished) == 4
    # Histograms: every claimed job waited in line; only successes have a total.
    assert value(samples, "chorus_job_queue_wait_seconds_count", priority="normal") == 2
    assert value(samples, "chorus_job_queue_wait_seconds_count", priority="high") == 1
    assert value(samples, "chorus_job_queue_wait_seconds_count", priority="low") == 1
    for priority in TEXTS:
        assert value(samples, "chorus_job_first_audio_seconds_count", priority=priority) == 1
        assert value(samples, "chorus_job_total_seconds_count", priority=priority) == 1
        first = value(samples, "chorus_job_first_audio_seconds_sum", priority=priority)
        whole = value(samples, "chorus_job_total_seconds_sum", priority=priority)
        assert 0 < first <= whole
        inf = value(samples, "chorus_job_total_seconds_bucket", priority=priority, le="+Inf")
        assert inf == 1
    # Requests by route pattern name, summed over both web processes.
    requests = "chorus_http_requests_total"
    assert value(samples, requests, route="speech-list", method="POST", status="202") == 4
    assert value(samples, requests, route="speech-list", method="POST", status="400") == 1
    assert value(samples, requests, route="voice-list", method="POST", status="201") == 1
    assert value(samples, requests, route="voice-detail", method="DELETE", status="204") == 1
    assert value(samples, "chorus_http_requests_in_progress") == 1  # this scrape
    # Read at scrape time: an empty queue, nothing in flight, one live worker.
    for priority in TEXTS:
        assert value(samples, "chorus_queue_depth", priority=priority) == 0
    assert total(samples, "chorus_jobs_in_flight") == 0
    assert value(samples, "chorus_broker_up") == 1
    [(_, labels)] = [key for key in samples if key[0] == "chorus_worker_info"]
    worker_name = dict(labels)["worker"]
    assert dict(labels)["engine"] == "synthetic"
    assert value(samples, "chorus_worker_up", worker=worker_name) == 1
    assert value(samples, "chorus_worker_streams_capacity", worker=worker_name) >= 1
    # Files of two web processes and the worker, named by host and pid.
    writers = {path.stem.split("_", 1)[1] for path in metrics_dir.glob("counter_*.db")}
    assert len(writers) >= 3, writers

    # Logs: the request's line and the worker's lines share the request id.
    web_lines = json_lines(web.lines)
    worker_lines = json_lines(worker.lines)
    submit = next(
        line
        for line in web_lines
        if line.get("event") == "request" and line.get("request_id") == "req-high-1"
    )
    assert submit["route"] == "speech-list"
    assert submit["method"] == "POST"
    assert submit["status"] == 202
    assert submit["tenant_id"] == alice.tenant.pk
    assert submit["job_id"] == jobs["high"]
    assert submit["duration_ms"] > 0
    job_lines = [line for line in worker_lines if line.get("job_id") == jobs["high"]]
    assert {line["request_id"] for line in job_lines} == {"req-high-1"}
    states = [line for line in job_lines if line.get("event") == "job"]
    assert [line["status"] for line in states] == ["running", "succeeded"]
    assert states[0]["attempt"] == 1
    assert states[0]["worker"] == worker_name
    assert states[0]["tenant_id"] == alice.tenant.pk
    failure = next(
        line
        for line in worker_lines
        if line.get("event") == "job" and line.get("status") == "failed"
    )
    assert (failure["job_id"], failure["code"]) == (doomed.json()["id"], "engine_error")
    refusal = next(line for line in web_lines if line.get("status") == 400)
    assert refusal["error_code"] == "unknown_field"
    # Never the text to speak, never the key.
    everything = "".join(web.lines + worker.lines)
    for text in [*TEXTS.values(), GONE_VOICE_TEXT]:
        assert text not in everything
    assert alice.key not in everything
    http.close()


def test_readiness_fails_while_the_broker_is_unreachable(
    asgi_server: Callable[..., AsgiServer],  # noqa: F811
) -> None:
    server = asgi_server({"REDIS_URL": f"redis://127.0.0.1:{dead_port()}/0"})
    response = httpx.get(f"{server.url}/readyz", timeout=30)
    assert response.status_code == 503
    assert response.json()["checks"]["broker"].startswith("failed")
    assert response.json()["checks"]["database"] == "ok"
    assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200


def test_readiness_passes_with_every_part_up(
    asgi_server: Callable[..., AsgiServer],  # noqa: F811
) -> None:
    assert django_settings.REDIS_URL
    server = asgi_server()
    response = httpx.get(f"{server.url}/readyz", timeout=30)
    assert response.status_code == 200, response.text


def test_workers_send_task_events_for_flower_when_enabled(
    start_worker: Callable[..., WorkerProcess], http_caller: Callable[[str], Any]
) -> None:
    from chorus.celery import app

    seen: list[dict[str, Any]] = []
    connection = app.connection_for_read()
    receiver = app.events.Receiver(connection, handlers={"*": seen.append})
    listening = threading.Thread(
        target=lambda: receiver.capture(limit=None, timeout=None, wakeup=False), daemon=True
    )
    listening.start()
    try:
        start_worker({"CHORUS_CELERY_EVENTS": "true"})
        alice = http_caller("alice")
        job = alice.http.post("/v1/speech", json={"text": "Events, please."}).json()
        assert wait_for_job(alice.http, job["id"])["status"] == "succeeded"
        deadline = time.monotonic() + 10
        while not any(event["type"] == "task-succeeded" for event in seen):
            assert time.monotonic() < deadline, sorted({event["type"] for event in seen})
            time.sleep(0.1)
    finally:
        receiver.should_stop = True
        listening.join(timeout=5)
        connection.release()
    types = {event["type"] for event in seen}
    assert {"task-received", "task-started", "task-succeeded"} <= types
    assert "worker-heartbeat" in types or "worker-online" in types
    # The task's arguments are ids, never the text.
    assert not any("Events, please." in json.dumps(event, default=str) for event in seen)
