"""A GPU worker told to stop (SIGTERM, as Kubernetes and spot machines do) drains:
it takes nothing new and says so to its readiness probe at once, gives its running
streams `CHORUS_WORKER_DRAIN_S` to finish, hands the rest back to the line for
another worker (charged once, the stream continued), and exits soon after.

Real processes: Celery workers on the synthetic engine, the web tier under
uvicorn for a streaming client, PostgreSQL (or the embedded SQLite) and Redis.
"""

from __future__ import annotations

import ast
import base64
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from django.utils import timezone

from synthesis.models import Job, JobStatus
from synthesis.services.jobs import job_create
from synthesis.speech_request import SpeechRequest
from tenants.models import Plan
from tests.conftest import Persona, make_persona
from tests.e2e.asgi import AsgiServer, asgi_server  # noqa: F401  (a fixture)
from tests.e2e.conftest import ROOT, SYNTHETIC, WorkerProcess, stack_env
from tests.faults.figures import outcome, wait_until_finished

pytestmark = [pytest.mark.e2e, pytest.mark.embedded, pytest.mark.django_db(transaction=True)]

STREAMS = 3
# 60-odd characters: about 3 s of audio each (the synthetic engine's 0.05 s a character).
TEXTS = [f"Job {n} of the drain keeps its stream going while the worker stops." for n in range(3)]
# After its jobs end, how soon a drained worker is gone (the pool's threads
# stop, the engine closes); and a short drain's hand-back on top of its deadline.
EXIT_AFTER_S = 8.0


def engine(tmp_path: Path, card: str, rtf: float) -> str:
    """The synthetic engine at `rtf`, on an emulated card of its own."""
    return json.dumps({**SYNTHETIC, "rtf": rtf, "state_dir": str(tmp_path / card)})


def running_on(worker: WorkerProcess, ids: list[Any], count: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    pid = worker.process.pid
    while (
        Job.objects.filter(pk__in=ids, status=JobStatus.RUNNING, worker__endswith=f":{pid}").count()
        < count
    ):
        assert time.monotonic() < deadline, "".join(worker.lines[-40:])
        time.sleep(0.05)


def worker_ready(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The pod's readiness probe, run as Kubernetes runs it."""
    return subprocess.run(
        [sys.executable, "manage.py", "worker_ready"],
        cwd=ROOT,
        env=stack_env(env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def in_queues(broker: Any, ids: list[Any]) -> list[str]:
    """Which of these jobs have a message waiting in a synthesis queue."""
    wanted = {str(job_id) for job_id in ids}
    return [
        job_id
        for queue in ("synth.high", "synth.normal", "synth.low")
        for raw in broker.lrange(queue, 0, -1)
        if (job_id := ast.literal_eval(json.loads(raw)["headers"]["argsrepr"])[0]) in wanted
    ]


def unacked(broker: Any, ids: list[Any]) -> list[str]:
    """Which of these jobs have a message delivered and not acknowledged (kombu
    keeps [message, exchange, routing key] per delivery; other tests' SIGKILLed
    workers may have left theirs)."""
    wanted = {str(job_id) for job_id in ids}
    return [
        job_id
        for raw in broker.hvals("unacked")
        if (job_id := ast.literal_eval(json.loads(raw)[0]["headers"]["argsrepr"])[0]) in wanted
    ]


def logged(worker: WorkerProcess, words: str) -> list[str]:
    """The worker's log messages that contain `words` (JSON lines or plain)."""
    return [
        re.sub(r'.*"message": "([^"]*)".*', r"\1", line.strip())
        for line in worker.lines
        if words in line
    ]


def test_a_roomy_drain_finishes_its_streams_takes_nothing_new_and_exits(
    start_worker: Callable[..., WorkerProcess], broker: Any, plan: Plan, tmp_path: Path
) -> None:
    env = {
        "CHORUS_WORKER_STREAMS": str(STREAMS),
        "CHORUS_WORKER_DRAIN_S": "30",
        "CHORUS_ENGINE_OPTIONS": engine(tmp_path, "gpu-a", rtf=1.0),
    }
    worker = start_worker(env)
    alice = make_persona("alice", plan)
    ids = [
        job_create(tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text=t)).pk
        for t in TEXTS
    ]
    running_on(worker, ids, STREAMS)

    os.kill(worker.process.pid, signal.SIGTERM)
    sigterm = time.monotonic()
    probe = worker_ready(env)
    probed_after = time.monotonic() - sigterm
    later = job_create(
        tenant=alice.tenant,
        api_key=alice.api_key,
        speech=SpeechRequest(text="Submitted during a drain."),
    )
    exitcode = worker.process.wait(timeout=30)
    exited_at, exited_after = timezone.now(), time.monotonic() - sigterm

    assert probe.returncode == 1, probe.stdout
    assert "draining" in probe.stderr
    assert exitcode == 0, "".join(worker.lines[-40:])
    jobs = list(Job.objects.filter(pk__in=ids))
    assert [(j.status, j.attempts) for j in jobs] == [(JobStatus.SUCCEEDED, 1)] * STREAMS
    last_end = max(j.finished_at for j in jobs if j.finished_at is not None)
    exit_lag = (exited_at - last_end).total_seconds()
    assert exit_lag < EXIT_AFTER_S  # gone soon after its last job, not at the deadline
    result = outcome(tenant=alice.tenant, job_ids=ids, repaired_at=jobs[0].created_at)
    assert (result.lost, result.double_charged) == (0, 0)
    # The job submitted during the drain did not start there: it waits in its
    # queue, and the next worker runs it.
    assert Job.objects.values_list("status", "worker").get(pk=later.pk) == (JobStatus.QUEUED, "")
    # Its finished jobs' messages were acknowledged on the way out: nothing is
    # left to come back after the broker's visibility timeout.
    assert in_queues(broker, [*ids, later.pk]) == [str(later.pk)]
    assert unacked(broker, [*ids, later.pk]) == []
    assert logged(worker, "draining: taking no new jobs")
    [end] = logged(worker, "drained in")
    assert f"{STREAMS} jobs finished, 0 handed back" in end
    successor = start_worker({**env, "CHORUS_ENGINE_OPTIONS": engine(tmp_path, "gpu-b", 0.2)})
    wait_until_finished([later.pk], bound_s=30)
    done = Job.objects.get(pk=later.pk)
    assert (done.status, done.worker.rsplit(":", 1)[1]) == (
        JobStatus.SUCCEEDED,
        str(successor.process.pid),
    )
    print(
        f"\nDRAIN roomy (30 s): probe failed {probed_after:.1f} s after SIGTERM; exit 0 after "
        f"{exited_after:.1f} s, {exit_lag:.1f} s after its last job; the worker logged: {end}"
    )


def stream_sse(server: AsgiServer, persona: Persona, text: str, into: dict[str, Any]) -> None:
    """A streaming client (SSE): its audio, the event it ended with, or the error
    its connection ended with (a hang shows as a read timeout)."""
    pcm = b""
    name = ""
    try:
        with (
            httpx.Client(
                base_url=server.url, headers={"Authorization": f"Bearer {persona.key}"}, timeout=30
            ) as http,
            http.stream(
                "POST",
                "/v1/speech",
                json={"text": text, "stream": True, "format": "pcm"},
                headers={"Accept": "text/event-stream"},
            ) as response,
        ):
            into["job_id"] = response.headers["X-Job-Id"]
            for line in response.iter_lines():
                if line.startswith("event: "):
                    name = line.removeprefix("event: ")
                elif line.startswith("data: ") and name == "audio":
                    pcm += base64.b64decode(json.loads(line.removeprefix("data: "))["audio"])
                elif line.startswith("data: "):
                    into["end"] = (name, json.loads(line.removeprefix("data: ")))
    except Exception as exc:
        into["error"] = repr(exc)
    into["pcm"] = pcm
    into["ended_at"] = time.monotonic()


def test_a_short_drain_hands_unfinished_jobs_to_another_worker_charged_once(
    start_worker: Callable[..., WorkerProcess],
    broker: Any,
    asgi_server: Callable[..., AsgiServer],  # noqa: F811
    plan: Plan,
    tmp_path: Path,
) -> None:
    drain_s = 1
    env = {
        "CHORUS_WORKER_STREAMS": str(STREAMS),
        "CHORUS_WORKER_DRAIN_S": str(drain_s),
        "CHORUS_ENGINE_OPTIONS": engine(tmp_path, "gpu-a", rtf=4.0),  # 12 s and more a job
    }
    server = asgi_server()
    worker = start_worker(env)
    alice = make_persona("alice", plan)
    client: dict[str, Any] = {}
    streaming = threading.Thread(target=stream_sse, args=(server, alice, TEXTS[0], client))
    streaming.start()
    deadline = time.monotonic() + 30
    while "job_id" not in client:
        assert time.monotonic() < deadline, client
        assert streaming.is_alive(), client
        time.sleep(0.05)
    ids = [client["job_id"]] + [
        job_create(tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text=t)).pk
        for t in TEXTS[1:]
    ]
    running_on(worker, ids, STREAMS)
    successor = start_worker(
        {
            **env,
            "CHORUS_WORKER_DRAIN_S": "60",
            "CHORUS_ENGINE_OPTIONS": engine(tmp_path, "gpu-b", 0.2),
        }
    )
    assert Job.objects.filter(pk__in=ids, status=JobStatus.RUNNING, attempts=1).count() == STREAMS

    os.kill(worker.process.pid, signal.SIGTERM)
    sigterm = time.monotonic()
    exitcode = worker.process.wait(timeout=drain_s + 30)
    exited_after = time.monotonic() - sigterm
    wait_until_finished(ids, bound_s=30)
    streaming.join(timeout=30)

    assert exitcode == 0, "".join(worker.lines[-40:])
    assert exited_after < drain_s + EXIT_AFTER_S
    jobs = {str(j.pk): j for j in Job.objects.filter(pk__in=ids)}
    successor_pid = str(successor.process.pid)
    for job in jobs.values():
        assert (job.status, job.attempts) == (JobStatus.SUCCEEDED, 2), job.pk
        assert job.worker.rsplit(":", 1)[1] == successor_pid
    result = outcome(tenant=alice.tenant, job_ids=ids, repaired_at=jobs[ids[0]].created_at)
    assert (result.lost, result.double_charged) == (0, 0)
    [end] = logged(worker, "drained in")
    assert f"0 jobs finished, {STREAMS} handed back" in end
    # The superseded attempts' messages were acknowledged as the worker left:
    # none comes back after the visibility timeout.
    deadline = time.monotonic() + 5
    while unacked(broker, ids):  # the successor's own acks, a moment behind its jobs
        assert time.monotonic() < deadline, unacked(broker, ids)
        time.sleep(0.05)
    assert in_queues(broker, ids) == []
    # The streaming client: the whole audio from the second attempt (the synthetic
    # engine is deterministic, so the relay joins it to what was already sent),
    # well within a bound, never a hang.
    assert not streaming.is_alive(), "the stream hangs"
    assert "error" not in client, client
    name, done = client["end"]
    assert (name, done["status"]) == ("done", "succeeded"), client["end"]
    streamed = np.frombuffer(client["pcm"], "<i2")
    stored = np.frombuffer(httpx.get(done["audio_url"], timeout=30).content, "<i2")
    assert len(streamed) == len(stored)
    assert np.corrcoef(streamed.astype(np.float64), stored.astype(np.float64))[0, 1] > 0.999
    print(
        f"\nDRAIN short ({drain_s} s): exit 0 after {exited_after:.1f} s; all succeeded on "
        f"the second worker, charged once; the stream ended complete "
        f"{client['ended_at'] - sigterm:.1f} s after SIGTERM; the worker logged: {end}"
    )


def test_a_message_on_its_way_to_a_draining_worker_goes_back_to_its_queue_at_once(
    start_worker: Callable[..., WorkerProcess], broker: Any, plan: Plan, tmp_path: Path
) -> None:
    """The worker is stopped (SIGSTOP) while its BRPOP waits, so the broker hands
    it the next message while it cannot run: SIGTERM arrives with a message
    taken, not started. It must not start there, and must be back in its queue
    while the worker still drains, not when the worker is gone."""
    env = {
        "CHORUS_WORKER_STREAMS": str(STREAMS),
        "CHORUS_WORKER_DRAIN_S": "30",
        "CHORUS_ENGINE_OPTIONS": engine(tmp_path, "gpu-a", rtf=2.0),  # 6 s and more a job
    }
    worker = start_worker(env)
    alice = make_persona("alice", plan)
    long_job = job_create(
        tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text=TEXTS[0])
    )
    running_on(worker, [long_job.pk], 1)
    time.sleep(0.5)  # its next BRPOP is waiting

    os.kill(worker.process.pid, signal.SIGSTOP)
    taken = job_create(
        tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text=TEXTS[1])
    )
    deadline = time.monotonic() + 5
    while in_queues(broker, [taken.pk]):  # the stopped worker's BRPOP took it
        assert time.monotonic() < deadline, "the message was not taken"
        time.sleep(0.02)
    os.kill(worker.process.pid, signal.SIGTERM)
    os.kill(worker.process.pid, signal.SIGCONT)
    sigterm = time.monotonic()
    while not in_queues(broker, [taken.pk]):
        assert time.monotonic() - sigterm < 5, "".join(worker.lines[-40:])
        time.sleep(0.02)
    back_after = time.monotonic() - sigterm

    assert worker.process.poll() is None  # still draining its long job
    assert Job.objects.values_list("status", "attempts").get(pk=taken.pk) == (JobStatus.QUEUED, 0)
    assert worker.process.wait(timeout=30) == 0
    assert Job.objects.get(pk=long_job.pk).status == JobStatus.SUCCEEDED
    [end] = logged(worker, "drained in")
    assert "1 jobs finished, 0 handed back, 0 failed (attempts used up), 1 taken" in end
    successor = start_worker({**env, "CHORUS_ENGINE_OPTIONS": engine(tmp_path, "gpu-b", 0.2)})
    wait_until_finished([taken.pk], bound_s=30)
    done = Job.objects.get(pk=taken.pk)
    assert (done.status, done.attempts) == (JobStatus.SUCCEEDED, 1)
    assert done.worker.rsplit(":", 1)[1] == str(successor.process.pid)
    print(f"\nDRAIN taken, not started: back in its queue {back_after:.2f} s after SIGTERM")
