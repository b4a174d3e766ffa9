"""End-to-end fixtures: a real Celery worker process, a live HTTP server, real
PostgreSQL and Redis, and (for the S3 backend) moto's S3 server on loopback.

The worker runs as a separate process exactly as in production (`celery -A chorus
worker -Q synth.high,synth.normal,synth.low`), pointed at the test database.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings as django_settings
from django.db import connection
from moto.server import ThreadedMotoServer

from synthesis.worker import worker_argv
from tenants.models import Plan
from tests.conftest import Persona, make_persona

ROOT = Path(__file__).resolve().parents[2]

# The synthetic engine's timing, shared by worker and assertions: quick, but
# with a visible first-chunk delay so timings are meaningful.
SYNTHETIC = {"first_chunk_delay_s": 0.05, "rtf": 0.05, "chunk_s": 0.25, "seconds_per_char": 0.05}


@dataclass
class WorkerProcess:
    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(" ready." in line for line in self.lines):
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError("worker did not start:\n" + "".join(self.lines[-60:]))

    def stop(self) -> None:
        stop_process(self.process)


def stop_process(process: subprocess.Popen[str]) -> None:
    """Terminate a child the way a supervisor would: SIGTERM, then SIGKILL."""
    stop_processes([process])


def stop_processes(processes: list[subprocess.Popen[str]]) -> None:
    """`stop_process` for several at once: all are told together, so their
    shutdowns overlap instead of adding up."""
    running = [process for process in processes if process.poll() is None]
    for process in running:
        process.terminate()
    deadline = time.monotonic() + 20
    for process in running:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def stack_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a child process of the stack (worker, uvicorn): the test
    database, Redis, storage and secret key this test process uses (one
    deployment: the key seals the webhook secrets this process writes)."""
    return {
        **os.environ,
        "CHORUS_SECRET_KEY": django_settings.SECRET_KEY,
        "DATABASE_URL": _database_url(),
        "REDIS_URL": django_settings.REDIS_URL or "",
        "CHORUS_STORAGE": "local",
        "CHORUS_STORAGE_ROOT": django_settings.STORAGE["local_root"],
        **(extra or {}),
    }


def _database_url() -> str:
    db = connection.settings_dict
    if connection.vendor == "sqlite":  # the embedded default: one file every process opens
        return f"sqlite:///{db['NAME']}"
    return f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.fixture
def start_worker(
    transactional_db: None, broker: Any, tmp_path: Path
) -> Iterator[Callable[..., WorkerProcess]]:
    """Start real worker processes; each is stopped at the end of the test."""
    assert connection.vendor in {"postgresql", "sqlite"}, "a database other processes can open"
    workers: list[WorkerProcess] = []

    def start(
        env: dict[str, str] | None = None, queues: str = "", wait: bool = True
    ) -> WorkerProcess:
        full_env = stack_env(
            {
                "CHORUS_ENGINE": "synthetic",
                "CHORUS_ENGINE_OPTIONS": json.dumps(
                    {**SYNTHETIC, "state_dir": str(tmp_path / "gpu")}
                ),
                **(env or {}),
            }
        )
        queue_names = tuple(queues.split(",")) if queues else None
        process = subprocess.Popen(
            worker_argv(queues=queue_names, hostname=f"e2e{len(workers)}@%h"),
            cwd=ROOT,
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        worker = WorkerProcess(process)
        threading.Thread(target=collect_lines, args=(process, worker.lines), daemon=True).start()
        workers.append(worker)
        if wait:
            worker.wait_ready()
        return worker

    yield start
    stop_processes([worker.process for worker in workers])


def collect_lines(process: subprocess.Popen[str], lines: list[str]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line)


@dataclass
class HttpCaller:
    persona: Persona
    http: httpx.Client


@pytest.fixture
def http_caller(
    live_server: Any, settings: Any, plan: Plan
) -> Iterator[Callable[[str], HttpCaller]]:
    """Tenants calling the live server over real HTTP (storage as configured then)."""
    settings.STORAGE = {**settings.STORAGE, "base_url": live_server.url}
    clients: list[httpx.Client] = []

    def make(slug: str) -> HttpCaller:
        persona = make_persona(slug, plan)
        http = httpx.Client(
            base_url=live_server.url,
            headers={"Authorization": f"Bearer {persona.key}"},
            timeout=30,
        )
        clients.append(http)
        return HttpCaller(persona, http)

    yield make
    for client in clients:
        client.close()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    # moto speaks the S3 protocol over HTTP but does not check signatures or
    # expiry; the app's own link checks are covered by the local backend's tests.
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def use_s3(settings: Any, endpoint: str, *, bucket_prefix: str) -> dict[str, str]:
    """Point this process's storage at the S3 server on loopback; returns the
    environment that does the same for a worker process."""
    env = {
        "CHORUS_STORAGE": "s3",
        "CHORUS_BUCKET_PREFIX": bucket_prefix,
        "S3_ENDPOINT_URL": endpoint,
        "S3_ACCESS_KEY_ID": "chorus-test",
        "S3_SECRET_ACCESS_KEY": "chorus-test-secret",
        "S3_REGION": "us-east-1",
    }
    settings.STORAGE = {
        **settings.STORAGE,
        "backend": "s3",
        "endpoint_url": endpoint,
        "access_key": env["S3_ACCESS_KEY_ID"],
        "secret_key": env["S3_SECRET_ACCESS_KEY"],
        "region": env["S3_REGION"],
        "bucket_prefix": bucket_prefix,
    }
    return env


def wait_for_job(http: httpx.Client, job_id: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = http.get(f"/v1/speech/{job_id}").json()
        if job["status"] in ("succeeded", "failed"):
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} still {job['status']} after {timeout} s")
