"""A worker host whose clock runs 3 s ahead adds nothing to the timings: a real
worker process under libfaketime, a job through it, and what the API and the
worker's queue-wait histogram say about its wait.

PostgreSQL only: the stamps are the database server's time (`chorus.db_clock`).
On the embedded default the database is a file whose clock is that of each
process opening it, all on one host; a shifted process clock there is not a
host's clock, and nothing can undo it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from synthesis.models import Job, JobStatus
from tests.conftest import Persona
from tests.e2e.asgi import free_port
from tests.e2e.conftest import WorkerProcess
from tests.e2e.port_metrics import scrape, value, wait_for_port
from tests.e2e.test_metrics_port import TOKEN, port_env, submit, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
AHEAD = timedelta(seconds=3)


@pytest.fixture(autouse=True)
def _synthetic_workers(settings: Any) -> None:
    settings.ENGINE = "synthetic"


def _logged_at(worker: WorkerProcess, job_id: str, status: str) -> datetime:
    """When the worker's own clock says it logged the job's `status`."""
    for line in worker.lines:
        if line.startswith("{"):
            entry = json.loads(line)
            if entry.get("job_id") == job_id and entry.get("status") == status:
                return datetime.fromisoformat(entry["ts"])
    raise AssertionError(f"no {status} line for job {job_id}:\n" + "".join(worker.lines[-40:]))


@pytest.mark.skipif(not FAKETIME.exists(), reason="libfaketime is not installed")
def test_a_worker_whose_clock_runs_ahead_adds_nothing_to_the_queue_wait(
    start_worker: Callable[..., WorkerProcess], alice: Persona, tmp_path: Path
) -> None:
    port = free_port()
    env = {"LD_PRELOAD": str(FAKETIME), "FAKETIME": "+3s"}
    worker = start_worker({**env, **port_env(port, tmp_path / "gpu-host")})
    wait_for_port(port, alive=lambda: worker.process.poll() is None, lines=worker.lines)

    # The wait runs from the submit's stamp, taken as its request starts: a cold
    # first request can take a second, all of it counted as waiting.
    posted = time.monotonic()
    job_id = submit(alice, "Three seconds ahead, and none of them counted.")
    bound = time.monotonic() - posted + 1  # a wait longer than this came from the clock
    wait_until(
        lambda: Job.objects.get(pk=job_id).status == JobStatus.SUCCEEDED, "succeeded", timeout=60
    )

    row = Job.objects.get(pk=job_id)
    assert row.started_at is not None
    # The worker's clock is ahead indeed: it logged the start 3 s after this
    # process's clock saw the submit (and the start came sooner than that).
    assert _logged_at(worker, job_id, "running") - row.created_at > AHEAD - timedelta(seconds=0.5)
    timings = alice.client.get(f"/v1/speech/{job_id}").json()["timings"]
    assert 0 <= timings["queue_wait_s"] < bound, timings
    assert 0 <= timings["first_audio_s"] < 1, timings
    assert 0 <= timings["total_s"] < bound + 1.5, timings

    samples = scrape(port, TOKEN)
    assert value(samples, "chorus_job_queue_wait_seconds_count", priority="normal") == 1
    waited = value(samples, "chorus_job_queue_wait_seconds_sum", priority="normal")
    assert waited is not None
    assert 0 <= waited < bound
    first_audio = value(samples, "chorus_job_first_audio_seconds_sum", priority="normal")
    assert first_audio is not None
    assert 0 <= first_audio < bound + 0.5
