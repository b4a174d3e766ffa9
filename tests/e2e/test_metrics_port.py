"""A host with no web process still serves its metrics: a real worker process and
a real sweeper process, each with CHORUS_METRICS_PORT, scraped over HTTP under
the web's token rule. Each is given a metrics folder of its own, as a host of its
own would have: what it serves is that folder's sum, not this process's."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from synthesis.models import Job, JobStatus
from tests.conftest import Persona
from tests.e2e.asgi import free_port
from tests.e2e.conftest import ROOT, WorkerProcess, collect_lines, stack_env, stop_process
from tests.e2e.port_metrics import get, names, scrape, value, wait_for_port

pytestmark = [pytest.mark.e2e, pytest.mark.embedded, pytest.mark.django_db(transaction=True)]

TOKEN = "port-metrics-token"
PRIORITIES = ("high", "normal", "low")
# Read from shared state at scrape time: the sweeper serves them, workers do not.
LINE_GAUGES = ("chorus_queue_depth", "chorus_oldest_waiting_job_age_seconds")


@pytest.fixture(autouse=True)
def _synthetic_workers(settings: Any) -> None:
    settings.ENGINE = "synthetic"


def port_env(port: int, folder: Path, token: str = TOKEN) -> dict[str, str]:
    return {
        "CHORUS_METRICS_PORT": str(port),
        "CHORUS_METRICS_TOKEN": token,
        "PROMETHEUS_MULTIPROC_DIR": str(folder),
    }


def submit(persona: Persona, text: str, **body: Any) -> str:
    response = persona.client.post("/v1/speech", {"text": text, **body}, format="json")
    assert response.status_code == 202, response.json()
    return str(response.json()["id"])


def wait_until(check: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"still not {what} after {timeout} s")


@pytest.fixture
def start_sweeper(transactional_db: None, broker: Any) -> Iterator[Callable[..., int]]:
    """Start `manage.py sweeper` with a metrics port; returns the port once it answers."""
    processes: list[subprocess.Popen[str]] = []

    def start(env: dict[str, str]) -> int:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "sweeper", "--interval", "0.2"],
            cwd=ROOT,
            env=stack_env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        processes.append(process)
        lines: list[str] = []
        threading.Thread(target=collect_lines, args=(process, lines), daemon=True).start()
        port = int(env["CHORUS_METRICS_PORT"])
        wait_for_port(port, alive=lambda: process.poll() is None, lines=lines)
        return port

    yield start
    for process in processes:
        stop_process(process)


def test_a_worker_serves_its_hosts_counts_on_its_own_port(
    start_worker: Callable[..., WorkerProcess], alice: Persona, tmp_path: Path
) -> None:
    port = free_port()
    worker = start_worker(port_env(port, tmp_path / "gpu-host"))
    wait_for_port(port, alive=lambda: worker.process.poll() is None, lines=worker.lines)

    assert get(port).status_code == 401
    assert get(port, "Bearer wrong").status_code == 401
    assert get(port, f"Bearer {TOKEN}x").status_code == 401
    assert get(port, f"Bearer {TOKEN}", path="/other").status_code == 404

    job_id = submit(alice, "Counted where the work is.", priority="high")
    wait_until(
        lambda: Job.objects.get(pk=job_id).status == JobStatus.SUCCEEDED, "succeeded", timeout=60
    )
    samples = scrape(port, TOKEN)
    finished = value(
        samples, "chorus_jobs_finished_total", priority="high", status="succeeded", code=""
    )
    assert finished == 1
    assert value(samples, "chorus_job_queue_wait_seconds_count", priority="high") == 1
    assert value(samples, "chorus_job_total_seconds_count", priority="high") == 1
    # The submit was counted by this test's web tier, another host's folder; and
    # what every process would report alike is left to the sweeper and the web.
    assert "chorus_jobs_admitted_total" not in names(samples)
    assert not names(samples) & {*LINE_GAUGES, "chorus_worker_up", "chorus_database_up"}


def test_the_sweeper_serves_its_sweeps_and_the_lines_gauges(
    start_sweeper: Callable[..., int], alice: Persona, tmp_path: Path
) -> None:
    waiting = submit(alice, "Nobody takes this one.", priority="low")  # no worker runs
    port = start_sweeper(port_env(free_port(), tmp_path / "sweeper-host"))

    assert get(port).status_code == 401
    assert get(port, "Bearer wrong").status_code == 401

    wait_until(lambda: (value(scrape(port, TOKEN), "chorus_sweeps_total") or 0) >= 1, "swept")
    first = scrape(port, TOKEN)
    wait_until(
        lambda: (
            value(scrape(port, TOKEN), "chorus_sweeps_total") > value(first, "chorus_sweeps_total")
        ),
        "sweeping again",
    )
    samples = scrape(port, TOKEN)
    assert value(samples, "chorus_broker_up") == 1
    assert value(samples, "chorus_database_up") == 1
    for gauge in LINE_GAUGES:
        for priority in PRIORITIES:
            assert value(samples, gauge, priority=priority) is not None, (gauge, priority)
    assert Job.objects.get(pk=waiting).status == JobStatus.QUEUED
    assert value(samples, "chorus_queue_depth", priority="low") >= 1
    assert value(samples, "chorus_oldest_waiting_job_age_seconds", priority="low") > 0
    assert value(samples, "chorus_oldest_waiting_job_age_seconds", priority="high") == 0


def test_without_a_configured_token_the_port_answers_404_like_the_webs_route(
    start_sweeper: Callable[..., int], tmp_path: Path
) -> None:
    port = start_sweeper(port_env(free_port(), tmp_path / "sweeper-host", token=""))

    assert get(port).status_code == 404
    assert get(port, "Bearer anything").status_code == 404
