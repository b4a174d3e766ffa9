"""Chaos: real worker processes killed with SIGKILL in the middle of jobs.

Each worker runs several jobs at once (threads on one emulated GPU), so a kill
loses every attempt it runs; a supervisor starts it again, and the new process
puts its dead predecessor's jobs back in their queues. Afterwards every job has
either succeeded exactly once or failed with a reason, none is lost (queued or
running forever), and the quota ledger balances: each job reserved once and
settled once, charged only if it succeeded.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db.models import Count, Q, Sum

from quotas.models import LedgerEntry, LedgerKind, UsagePeriod
from synthesis.models import Job, JobStatus
from tests.e2e.conftest import (
    ROOT,
    SYNTHETIC,
    HttpCaller,
    WorkerProcess,
    stack_env,
    stop_process,
    wait_for_job,
)

pytestmark = [pytest.mark.e2e, pytest.mark.embedded, pytest.mark.django_db(transaction=True)]

KILLS = 10  # each lands on a worker running several jobs
JOBS = 80  # submitted up front
LINE = 20  # while killing, more are submitted when fewer than this are left open
MOST_JOBS = 200
# Long enough (about 1.6 s of emulated compute alone) for kills to land mid-job.
TEXT = "Chaos does not lose jobs, and it never charges twice for one."


def test_sigkills_of_busy_multi_stream_workers_lose_no_job_and_charge_nothing_twice(
    start_worker: Callable[..., WorkerProcess],
    http_caller: Callable[[str], HttpCaller],
    tmp_path: Path,
    settings: Any,
) -> None:
    settings.TENANT_BROKER_SLOTS = 10  # enough in the broker to fill both workers
    options = {**SYNTHETIC, "rtf": 0.5, "state_dir": str(tmp_path / "gpu")}
    envs = [
        {"CHORUS_ENGINE_OPTIONS": json.dumps({**options, "device": f"emu{n}"})} for n in range(2)
    ]
    workers = [start_worker(env) for env in envs]
    alice = http_caller("alice")
    ids: list[str] = []

    def top_up() -> None:
        """Keep work in line, so that every kill finds jobs running: on a slow
        host a restart takes seconds, while the other worker empties the line."""
        waiting = Job.objects.filter(tenant=alice.persona.tenant).exclude(
            status__in=[JobStatus.SUCCEEDED, JobStatus.FAILED]
        )
        while len(ids) < JOBS or (len(ids) < MOST_JOBS and waiting.count() < LINE):
            response = alice.http.post("/v1/speech", json={"text": TEXT})
            assert response.status_code == 202, response.text
            ids.append(response.json()["id"])

    top_up()

    # The sweeper runs as in production, and catches deliveries a killed worker
    # took but never claimed.
    sweeper = subprocess.Popen(
        [sys.executable, "manage.py", "sweeper", "--interval", "2"], cwd=ROOT, env=stack_env()
    )
    try:
        kills, most_running_at_a_kill = kill_busy_workers(start_worker, workers, envs, top_up)
        finished = [wait_for_job(alice.http, job_id, timeout=120) for job_id in ids]
    finally:
        stop_process(sweeper)
    assert kills == KILLS, f"only {kills} kills landed on running jobs"
    assert most_running_at_a_kill > 1, "the workers never ran two jobs at once"

    statuses = {job["status"] for job in finished}
    assert statuses <= {"succeeded", "failed"}, statuses
    for job in finished:
        if job["status"] == "failed":
            assert job["error"]["code"] == "worker_lost", job["error"]
            assert job["error"]["message"]
    tenant = alice.persona.tenant
    per_job = (
        LedgerEntry.objects.filter(tenant=tenant)
        .values("job_id")
        .annotate(
            reserves=Count("id", filter=Q(kind=LedgerKind.RESERVE)),
            commits=Count("id", filter=Q(kind=LedgerKind.COMMIT)),
            refunds=Count("id", filter=Q(kind=LedgerKind.REFUND)),
        )
    )
    succeeded = {
        str(pk)
        for pk in Job.objects.filter(tenant=tenant, status="succeeded").values_list("pk", flat=True)
    }
    assert len(per_job) == len(ids)
    for row in per_job:
        charged = str(row["job_id"]) in succeeded
        assert (row["reserves"], row["commits"], row["refunds"]) == (
            (1, 1, 0) if charged else (1, 0, 1)
        ), row
    period = UsagePeriod.objects.get(tenant=tenant)
    chars = Job.objects.filter(tenant=tenant, status="succeeded").aggregate(n=Sum("characters"))
    assert period.characters_used == (chars["n"] or 0)
    assert period.characters_reserved == 0
    print(
        f"\nchaos: {kills} kills (up to {most_running_at_a_kill} jobs each), "
        f"{len(succeeded)} succeeded, "
        f"{len(ids) - len(succeeded)} failed (worker_lost), 0 lost, 0 double-charged"
    )


def kill_busy_workers(
    start_worker: Callable[..., WorkerProcess],
    workers: list[WorkerProcess],
    envs: list[dict[str, str]],
    top_up: Callable[[], None],
) -> tuple[int, int]:
    """SIGKILL workers while they run jobs, restarting each as a supervisor would;
    returns the kills and the most jobs one killed worker was running."""
    rng = random.Random(7)
    kills = 0
    most_running_at_a_kill = 0
    deadline = time.monotonic() + 180  # a guard against a hang, not a pace
    while kills < KILLS and time.monotonic() < deadline:
        time.sleep(rng.uniform(0.2, 0.5))
        top_up()
        running = Job.objects.filter(status=JobStatus.RUNNING).values_list("worker", flat=True)
        busy = Counter(int(name.rsplit(":", 1)[1]) for name in running if ":" in name)
        targets = [n for n, worker in enumerate(workers) if busy[worker.process.pid]]
        if not targets:
            continue
        n = rng.choice(targets)
        try:
            os.kill(workers[n].process.pid, signal.SIGKILL)
        except ProcessLookupError:
            continue  # it exited since we looked: not a kill
        kills += 1
        most_running_at_a_kill = max(most_running_at_a_kill, busy[workers[n].process.pid])
        # The dead process stays a zombie until reaped, as under a supervisor
        # that has not looked yet; the new one must still see it as dead.
        workers[n] = start_worker(envs[n])
    return kills, most_running_at_a_kill
