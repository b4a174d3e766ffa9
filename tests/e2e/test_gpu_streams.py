"""One GPU worker runs several jobs at once on one loaded engine, and keeps a
stream free for `high` work however much `low` work waits.

Real worker processes (threads pool) on one emulated T4, real PostgreSQL and
Redis, jobs submitted over HTTP."""

from __future__ import annotations

import itertools
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from chorus.redis_client import get_redis
from synthesis.models import Job, JobStatus, WorkerHeartbeat
from tests.e2e.conftest import SYNTHETIC, HttpCaller, WorkerProcess, wait_for_job

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# About 1.6 s of emulated work per job alone: long enough to see them overlap.
SLOW = {**SYNTHETIC, "rtf": 0.5}
TEXT = "A stream that takes a while, so that several of them overlap in time."


def submit(caller: HttpCaller, n: int, priority: str) -> list[str]:
    ids = []
    for _ in range(n):
        response = caller.http.post("/v1/speech", json={"text": TEXT, "priority": priority})
        assert response.status_code == 202, response.text
        ids.append(response.json()["id"])
    return ids


def running(priority: str | None = None) -> list[Job]:
    jobs = Job.objects.filter(status=JobStatus.RUNNING)
    return list(jobs.filter(priority=priority) if priority else jobs)


def wait_until(condition: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def brpops() -> int:
    """BRPOPs the broker has answered so far: the worker's asks for work (no other
    client here takes from a queue)."""
    client = get_redis()
    assert client is not None
    stats = client.info("commandstats").get("cmdstat_brpop", {"calls": 0})
    return int(stats["calls"])


def ledger(state_dir: Path) -> list[dict[str, Any]]:
    document = json.loads((state_dir / "emu0.ledger.json").read_text())
    return list(document["reservations"].values())


def test_one_worker_runs_its_normal_limit_of_jobs_at_once_on_one_engine(
    start_worker: Callable[..., WorkerProcess],
    http_caller: Callable[[str], HttpCaller],
    tmp_path: Path,
    settings: Any,
) -> None:
    settings.TENANT_BROKER_SLOTS = 10
    state_dir = tmp_path / "gpu"
    worker = start_worker(
        {"CHORUS_ENGINE_OPTIONS": json.dumps({**SLOW, "state_dir": str(state_dir)})}
    )
    alice = http_caller("alice")
    ids = submit(alice, 8, "normal")

    most = 0
    reservations: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and Job.objects.filter(status__in=("queued", "running")):
        now_running = running()
        if len(now_running) > most:
            most = len(now_running)
            reservations = ledger(state_dir)
        time.sleep(0.05)
    jobs = [wait_for_job(alice.http, job_id) for job_id in ids]

    assert {job["status"] for job in jobs} == {"succeeded"}
    # The T4 profile's `normal` limit: five streams, not one, and never more.
    assert most == 5
    (name,) = set(Job.objects.values_list("worker", flat=True))  # all on the one worker
    assert name.endswith(f":{worker.process.pid}")
    # One model on the device, shared by the five streams running on it.
    assert [r["kind"] for r in reservations].count("model") == 1
    assert [r["kind"] for r in reservations].count("stream") == 5
    assert {r["pid"] for r in reservations} == {worker.process.pid}
    heartbeat = WorkerHeartbeat.objects.get(name=name)
    assert heartbeat.slots == 7  # what the device's memory holds


def test_a_high_job_starts_at_once_while_the_worker_is_full_of_low_jobs(
    start_worker: Callable[..., WorkerProcess],
    http_caller: Callable[[str], HttpCaller],
    tmp_path: Path,
    settings: Any,
) -> None:
    settings.TENANT_BROKER_SLOTS = 10
    start_worker(
        {
            "CHORUS_ENGINE_OPTIONS": json.dumps({**SLOW, "state_dir": str(tmp_path / "gpu")}),
            # Three streams for any priority, one more only for `high`.
            "CHORUS_WORKER_STREAMS": "3,3,4",
        }
    )
    bulk, demo = http_caller("bulk"), http_caller("demo")
    low_ids = submit(bulk, 8, "low")
    wait_until(lambda: len(running("low")) == 3)
    # The worker is full, and stays so: it goes on asking the broker for work
    # (a BRPOP every 50 ms, leaving `synth.low` out) and no fourth low job starts.
    asked = brpops()
    wait_until(lambda: brpops() >= asked + 5, timeout=10)
    assert len(running("low")) == 3

    (high_id,) = submit(demo, 1, "high")
    wait_until(lambda: Job.objects.get(pk=high_id).started_at is not None, timeout=5)
    high = Job.objects.get(pk=high_id)
    assert (high.started_at - high.created_at).total_seconds() < 0.5
    assert len(running("low")) == 3  # no low job had to finish first
    assert Job.objects.filter(priority="low", status__in=("queued", "pending")).count() >= 4

    assert wait_for_job(demo.http, high_id)["status"] == "succeeded"
    assert {wait_for_job(bulk.http, i, timeout=90)["status"] for i in low_ids} == {"succeeded"}


def test_a_tenants_backlog_starts_each_job_at_once_while_its_lane_is_full(
    start_worker: Callable[..., WorkerProcess],
    http_caller: Callable[[str], HttpCaller],
    tmp_path: Path,
    settings: Any,
) -> None:
    """With its one `normal` stream busy the worker's BRPOP asks for `synth.high`
    only; the tenant's next job, released by the running job's claim, must start
    as soon as the stream frees, not when that BRPOP times out a second later."""
    settings.TENANT_BROKER_SLOTS = 2  # production fair admission: each claim releases the next
    start_worker(
        {
            "CHORUS_ENGINE_OPTIONS": json.dumps({**SYNTHETIC, "state_dir": str(tmp_path / "gpu")}),
            "CHORUS_WORKER_STREAMS": "1,1,2",  # one stream for normal work, a second for high
            "CHORUS_TENANT_BROKER_SLOTS": "2",
        }
    )
    alice = http_caller("alice")
    ids = submit(alice, 8, "normal")
    assert {wait_for_job(alice.http, i, timeout=90)["status"] for i in ids} == {"succeeded"}

    jobs = sorted(Job.objects.filter(pk__in=ids), key=lambda job: job.started_at)
    assert all(
        earlier.finished_at <= later.started_at for earlier, later in itertools.pairwise(jobs)
    )  # one at a time, as the normal lane allows
    waits = [
        (later.started_at - earlier.finished_at).total_seconds()
        for earlier, later in itertools.pairwise(jobs)
    ]
    # A stalled BRPOP made every wait about a second; now tens of milliseconds.
    assert statistics.median(waits) < 0.3, waits


def test_a_worker_that_takes_only_low_work_runs_the_cards_normal_count_of_it(
    start_worker: Callable[..., WorkerProcess],
    http_caller: Callable[[str], HttpCaller],
    tmp_path: Path,
    settings: Any,
) -> None:
    """A low-only pool never sees the high stream a card's `low` limit keeps room
    for: its worker runs the T4 profile's five normal streams for low work."""
    settings.TENANT_BROKER_SLOTS = 10
    worker = start_worker(
        {"CHORUS_ENGINE_OPTIONS": json.dumps({**SLOW, "state_dir": str(tmp_path / "gpu")})},
        queues="synth.low",
    )
    bulk = http_caller("bulk")
    ids = submit(bulk, 7, "low")
    wait_until(lambda: len(running("low")) == 5)
    heartbeat = WorkerHeartbeat.objects.get(name__endswith=f":{worker.process.pid}")
    assert (heartbeat.streams_low, heartbeat.streams_normal, heartbeat.slots) == (5, 5, 5)
    assert {wait_for_job(bulk.http, i, timeout=90)["status"] for i in ids} == {"succeeded"}
