"""Fault: the worker is killed (SIGKILL) twice while it runs several jobs.

The short form of `tests/e2e/test_chaos.py` (80 jobs, 10 kills, two workers; it
asserts no job lost and none charged twice, but states no bound on how long a job
waits): one worker running three jobs at once, killed twice, each time started
again at once as a supervisor would. The new process requeues its dead
predecessor's jobs (same host, pid gone); the sweeper runs as in production.

Expected: every job succeeds (two kills use at most two of a job's three
attempts), is charged once, and none is unfinished past the bound.

And the narrowest kill: between a job's commit as `queued` and its message's
send. The restarted worker alone sends it (no sweeper).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from synthesis.models import Job, JobStatus, WorkerHeartbeat
from synthesis.services.jobs import job_create
from synthesis.speech_request import SpeechRequest
from tenants.models import Plan
from tests.conftest import make_persona
from tests.e2e.conftest import ROOT, SYNTHETIC, WorkerProcess, stack_env, stop_process
from tests.faults.figures import outcome, wait_until_finished

pytestmark = [pytest.mark.e2e, pytest.mark.embedded, pytest.mark.django_db(transaction=True)]

JOBS = 6
KILLS = 2
BOUND_S = 30.0  # no job may stay unfinished longer than this after the last kill
TEXT = "Chaos does not lose jobs, and it never charges twice for one."  # ~1.6 s at rtf 0.5


def test_jobs_of_a_worker_killed_twice_all_succeed_charged_once(
    start_worker: Callable[..., WorkerProcess], plan: Plan, tmp_path: Any
) -> None:
    env = {
        "CHORUS_WORKER_STREAMS": "3",
        "CHORUS_ENGINE_OPTIONS": json.dumps(
            {**SYNTHETIC, "rtf": 0.5, "state_dir": str(tmp_path / "gpu")}
        ),
    }
    worker = start_worker(env)
    sweeper = subprocess.Popen(
        [sys.executable, "manage.py", "sweeper", "--interval", "2"],
        cwd=ROOT,
        env=stack_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    alice = make_persona("alice", plan)
    ids = [
        job_create(tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text=TEXT)).pk
        for _ in range(JOBS)
    ]
    running_at_kills = []
    try:
        for _ in range(KILLS):
            deadline = time.monotonic() + 20
            while True:
                running = Job.objects.filter(
                    pk__in=ids, status=JobStatus.RUNNING, worker__endswith=f":{worker.process.pid}"
                ).count()
                if running:
                    break
                assert time.monotonic() < deadline, "".join(worker.lines[-40:])
                time.sleep(0.05)
            os.kill(worker.process.pid, signal.SIGKILL)
            killed_at = timezone.now()
            running_at_kills.append(running)
            worker = start_worker(env)
        wait_until_finished(ids, bound_s=BOUND_S)
    finally:
        stop_process(sweeper)

    result = outcome(tenant=alice.tenant, job_ids=ids, repaired_at=killed_at)
    seen = [alice.client.get(f"/v1/speech/{job_id}").json() for job_id in ids]
    attempts = sorted(Job.objects.filter(pk__in=ids).values_list("attempts", flat=True))
    client_saw = (
        f"{sum(job['status'] == 'succeeded' for job in seen)}/{JOBS} succeeded "
        f"(kills hit {'+'.join(map(str, running_at_kills))} running jobs; "
        f"attempts {','.join(map(str, attempts))})"
    )
    print("\n" + result.line(f"worker killed {KILLS}x mid-job", client_saw))
    assert result.lost == 0, (result.statuses, "".join(worker.lines[-40:]))
    assert result.double_charged == 0
    assert result.longest_stall_s < BOUND_S
    assert [job["status"] for job in seen] == ["succeeded"] * JOBS
    assert max(attempts) > 1  # the kills did land on running jobs


def test_a_message_its_killed_worker_never_sent_goes_out_from_the_next_one(
    start_worker: Callable[..., WorkerProcess], broker: Any, plan: Plan, tmp_path: Any
) -> None:
    """A worker killed between committing a job `queued` (a release, a requeue)
    and sending its message: the job says it was published a moment before the
    kill, and no message exists. The worker started in its place sends it, with no
    sweeper running, though its first look comes too early to tell a lost send
    from one under way (a worker starts in under 2 s)."""
    alice = make_persona("alice", plan)
    job = job_create(tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text=TEXT))
    broker.delete(*django_settings.SYNTH_QUEUES)  # the message that was never sent
    # Too young for the first look however long the worker takes to start; once
    # it has looked (its heartbeat starts after), published just before it started.
    young = Job.objects.filter(pk=job.pk)
    young.update(published_at=timezone.now() + timedelta(hours=1))

    worker = start_worker(
        {"CHORUS_ENGINE_OPTIONS": json.dumps({**SYNTHETIC, "state_dir": str(tmp_path / "gpu")})},
        wait=False,
    )
    deadline = time.monotonic() + 60
    beat = WorkerHeartbeat.objects.filter(name__endswith=f":{worker.process.pid}")
    while (started_at := beat.values_list("started_at", flat=True).first()) is None:
        assert time.monotonic() < deadline, "".join(worker.lines[-40:])
        time.sleep(0.02)
    young.update(published_at=started_at - timedelta(seconds=0.5))

    deadline = time.monotonic() + 20
    while Job.objects.get(pk=job.pk).status == JobStatus.QUEUED:
        assert time.monotonic() < deadline, "".join(worker.lines[-40:])
        time.sleep(0.1)
    wait_until_finished([job.pk], bound_s=BOUND_S)
    job.refresh_from_db()
    assert (job.status, job.attempts) == (JobStatus.SUCCEEDED, 1)
