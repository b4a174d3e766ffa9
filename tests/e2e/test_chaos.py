"""Chaos: real worker processes killed with SIGKILL in the middle of jobs.

Afterwards every job has either succeeded exactly once or failed with a reason,
none is lost (queued or running forever), and the quota ledger balances: each
job reserved once and settled once, charged only if it succeeded.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db.models import Count, Q, Sum

from quotas.models import LedgerEntry, LedgerKind, UsagePeriod
from synthesis.models import Job, JobStatus
from tests.e2e.conftest import SYNTHETIC, HttpCaller, WorkerProcess, wait_for_job

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

KILLS = 20
JOBS = 30
# Long enough (about 0.6 s of emulated compute) for kills to land mid-job.
TEXT = "Chaos does not lose jobs, and it never charges twice for one."


def children(worker: WorkerProcess) -> list[int]:
    out = subprocess.run(
        ["pgrep", "-P", str(worker.process.pid)], capture_output=True, text=True, check=False
    )
    return [int(pid) for pid in out.stdout.split()]


def test_twenty_sigkills_lose_no_job_and_charge_nothing_twice(
    start_worker: Callable[..., WorkerProcess],
    http_caller: Callable[[str], HttpCaller],
    tmp_path: Path,
) -> None:
    options = {**SYNTHETIC, "rtf": 0.2, "state_dir": str(tmp_path / "gpu")}
    workers = [
        start_worker({"CHORUS_ENGINE_OPTIONS": json.dumps({**options, "device": f"emu{n}"})})
        for n in range(2)
    ]
    alice = http_caller("alice")
    ids = []
    for _ in range(JOBS):
        response = alice.http.post("/v1/speech", json={"text": TEXT})
        assert response.status_code == 202, response.text
        ids.append(response.json()["id"])

    rng = random.Random(7)
    kills = 0
    deadline = time.monotonic() + 60
    while kills < KILLS and time.monotonic() < deadline:
        time.sleep(rng.uniform(0.2, 0.5))
        # Kill the pool process of a worker that is running a job right now.
        running = Job.objects.filter(status=JobStatus.RUNNING).values_list("worker", flat=True)
        busy_pids = {int(name.rsplit(":", 1)[1]) for name in running if ":" in name}
        targets = [pid for worker in workers for pid in children(worker) if pid in busy_pids]
        if not targets:
            continue
        try:
            os.kill(rng.choice(targets), signal.SIGKILL)
        except ProcessLookupError:
            continue  # it exited since we looked (finished, or recycled): not a kill
        kills += 1
    assert kills == KILLS, f"only {kills} kills landed on running jobs"

    finished = [wait_for_job(alice.http, job_id, timeout=120) for job_id in ids]

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
    assert len(per_job) == JOBS
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
        f"\nchaos: {kills} kills, {len(succeeded)} succeeded, "
        f"{JOBS - len(succeeded)} failed (worker_lost), 0 lost, 0 double-charged"
    )
