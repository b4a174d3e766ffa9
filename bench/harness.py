"""Shared set-up for the scheduling benchmarks: a real stack on this machine.

PostgreSQL and Redis from DATABASE_URL / REDIS_URL (defaults: the test
services, a database and Redis db of the benchmarks' own), N real worker
processes with the synthetic engine, each on its own emulated GPU, and
submissions through the service layer (the API adds the same few ms to every
job, so it does not change the scheduling picture).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench_tenants import forget_bench_tenants

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chorus.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/chorus_bench")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/11")
os.environ.setdefault("CHORUS_DATA_DIR", str(Path(tempfile.gettempdir()) / "chorus-bench"))
OUT = ROOT / "bench" / "out"


def setup(*, broker_slots: int) -> None:
    """Configure and start Django for this process (and the workers it starts)."""
    os.environ["CHORUS_TENANT_BROKER_SLOTS"] = str(broker_slots)
    os.environ["CHORUS_STORAGE"] = "local"
    os.environ["CHORUS_STORAGE_ROOT"] = tempfile.mkdtemp(prefix="chorus-bench-store-")
    ensure_database()
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    _reset()


def ensure_database() -> None:
    import psycopg

    url = os.environ["DATABASE_URL"]
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def _reset() -> None:
    """Empty queues and earlier runs' rows, so every run starts alike."""
    from django.conf import settings

    from chorus.redis_client import get_redis
    from synthesis.models import Job, WorkerHeartbeat

    client = get_redis()
    assert client is not None
    client.delete(*settings.SYNTH_QUEUES, "unacked", "unacked_index")
    Job.objects.all().delete()
    WorkerHeartbeat.objects.all().delete()
    forget_bench_tenants()


def tenant(slug: str) -> Any:
    """A tenant with room for any benchmark (enterprise plan, no practical caps)."""
    from tenants.models import Plan
    from tenants.services import tenant_create

    created = tenant_create(slug=f"bench-{slug}", plan=Plan.objects.get(name="enterprise"))
    created.limit_overrides = {"max_concurrent_jobs": 100_000, "monthly_characters": 10**9}
    created.save(update_fields=["limit_overrides"])
    return created


@contextmanager
def workers(count: int, engine: dict[str, Any], queues: str = "") -> Iterator[list[Any]]:
    """`count` worker processes, each its own emulated GPU; stopped on exit. The
    list is live: `restart(procs, n, ...)` replaces a dead one, as a supervisor would."""
    state = tempfile.mkdtemp(prefix="chorus-bench-gpu-")
    procs = [start_worker(n, engine, state, queues) for n in range(count)]
    try:
        _wait_for_workers(count)
        yield procs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def start_worker(n: int, engine: dict[str, Any], state: str, queues: str = "") -> Any:
    from synthesis.worker import worker_argv

    options = {**engine, "device": f"bench{n}", "state_dir": state}
    env = {
        **os.environ,
        "CHORUS_ENGINE": "synthetic",
        "CHORUS_ENGINE_OPTIONS": json.dumps(options),
    }
    argv = worker_argv(
        queues=tuple(queues.split(",")) if queues else None,
        hostname=f"bench{n}@%h",
        loglevel="WARNING",
    )
    process = subprocess.Popen(argv, cwd=ROOT, env=env)
    process.chorus_restart = (n, engine, state, queues)  # type: ignore[attr-defined]
    return process


def restart(procs: list[Any], n: int) -> None:
    """Start worker `n` again after it died (its successor requeues its jobs)."""
    procs[n] = start_worker(*procs[n].chorus_restart)


def _wait_for_workers(count: int, timeout: float = 90) -> None:
    from synthesis.models import WorkerHeartbeat

    deadline = time.monotonic() + timeout
    while WorkerHeartbeat.objects.count() < count:
        if time.monotonic() > deadline:
            raise RuntimeError("workers did not start")
        time.sleep(0.2)
    time.sleep(1.0)  # let each pool finish connecting to the broker


def wait_all(ids: list[Any], timeout: float) -> None:
    from synthesis.models import FINISHED, Job

    deadline = time.monotonic() + timeout
    while Job.objects.filter(pk__in=ids).exclude(status__in=FINISHED).exists():
        if time.monotonic() > deadline:
            raise RuntimeError("jobs did not finish in time")
        time.sleep(0.2)


def process_cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (user + system), its children's included; 0
    for what has exited meanwhile."""
    import psutil

    try:
        parent = psutil.Process(pid)
        family = [parent, *parent.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for each in family:
        try:
            times = each.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def save_plot(name: str, draw: Any) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    OUT.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4))
    draw(ax)
    fig.tight_layout()
    path = OUT / name
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


_http_storage_root: str | None = None


def http_tenant(slug: str) -> tuple[Any, str]:
    """A tenant with no practical limits for benchmarks over HTTP, its bucket in a
    fresh local folder, and a new key: (tenant, key). Call after django.setup()."""
    from django.conf import settings

    from synthesis.storage_runtime import get_storage
    from tenants.models import Plan, Tenant
    from tenants.services import api_key_create, tenant_create

    global _http_storage_root
    if _http_storage_root is None:  # one folder for every tenant of the run
        _http_storage_root = tempfile.mkdtemp(prefix="chorus-bench-")
        os.environ.update(CHORUS_STORAGE="local", CHORUS_STORAGE_ROOT=_http_storage_root)
        settings.STORAGE = {**settings.STORAGE, "local_root": _http_storage_root}
    plan, _ = Plan.objects.update_or_create(
        name="bench-streaming",
        defaults={
            "monthly_characters": 10**12,
            "requests_per_minute": 10**6,
            "max_concurrent_jobs": 10**4,
            "allowed_priorities": ["high", "normal", "low"],
            "storage_bytes": 10**15,
        },
    )
    tenant = Tenant.objects.filter(slug=slug).first() or tenant_create(slug=slug, plan=plan)
    Tenant.objects.filter(pk=tenant.pk).update(plan=plan)
    get_storage().ensure_bucket(tenant.bucket)
    _, key = api_key_create(tenant=tenant, name="bench")
    return tenant, key


# A submit's body for the in-process request benches (`bench/gc_per_request.py`,
# `bench/prepared_statements.py`) and the admission bench.
ADMISSION_BODY = json.dumps({"text": "Admission bench: a sentence of an ordinary length."})


def in_process_tenants(count: int, *, before_jobs: Any = None) -> tuple[list[Any], list[str]]:
    """For requests through Django's test client in this process: set up Django
    on the bench's database, then `count` tenants' clients (keys warmed) and, per
    tenant, the URL of a job held back `pending` (its third: two go to the broker,
    with the production default of two broker slots). `before_jobs` runs once
    Django is set up, before those jobs (a reset of the line)."""
    ensure_database()
    import django

    django.setup()
    from django.core.management import call_command
    from django.test import Client

    call_command("migrate", verbosity=0)
    keys = [http_tenant(f"admission-{n:03d}")[1] for n in range(count)]
    if before_jobs is not None:
        before_jobs()
    clients = [Client(HTTP_AUTHORIZATION=f"Bearer {key}") for key in keys]
    urls = []
    for client in clients:
        for _ in range(3):
            answer = client.post("/v1/speech", ADMISSION_BODY, content_type="application/json")
        urls.append(f"/v1/speech/{answer.json()['id']}")
    return clients, urls


@contextmanager
def quiet_web(*, workers: int = 1) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """Web processes on a free port as production runs them (`chorus.web_server`),
    their output and per-request logs dropped (a log line per request is not what
    the benchmarks measure): (the supervisor process, the port), once it answers
    `/healthz`; stopped on the way out."""
    import socket

    import requests

    from chorus.web_server import web_server_argv

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    web = subprocess.Popen(
        [str(a) for a in web_server_argv(host="127.0.0.1", port=port, workers=workers)],
        cwd=ROOT,
        env={**os.environ, "CHORUS_LOG_LEVEL": "WARNING"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the web server did not start")
            time.sleep(0.2)
        yield web, port
    finally:
        web.terminate()
        web.wait(30)
