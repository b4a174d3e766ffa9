"""A big batch's admission, and what another tenant sees while it runs.

One tenant (alice) submits one batch of `--items` items (default 5,000, the
enterprise plan's most) through the service (`batches.services.batch_create`);
meanwhile a prober process, started before and stopped after, does two things
over and over:

- takes alice's admission lock, as a submit of hers would, and times the wait
  (`lock wait`): on SQLite that is the database's write lock (BEGIN IMMEDIATE:
  every tenant's writes queue on it), on PostgreSQL alice's tenant row lock
  (other tenants never wait on it). The longest wait is, within the probe's
  20 ms pause, the longest time the batch held that lock at a stretch;
- submits a single job as another tenant (bob, `job_create`) every 100 ms and
  times it (`bob submit`).

It prints one row per backend: the admission's time, the longest lock wait,
bob's submits (median, longest, how many failed, by code). Run on the same
machine before and after a change to compare.

  REDIS_URL=redis://127.0.0.1:6379/11 .venv/bin/python bench/batch_admission.py \\
    [--items 5000] [--backends sqlite,postgresql] \\
    [--pg-url postgres://postgres@127.0.0.1:5432/chorus_batch_bench]

SQLite is the embedded default's file in a fresh data folder; PostgreSQL a
database of the bench's own (created if missing, its bench tenants deleted
first). Both publish to the Redis of REDIS_URL (the queues it uses are emptied).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PG_URL = "postgres://postgres@127.0.0.1:5432/chorus_batch_bench"
PROBE_PAUSE_S = 0.02
SUBMIT_EVERY_S = 0.1


def backend_env(backend: str, pg_url: str, data_dir: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.setdefault("REDIS_URL", "redis://127.0.0.1:6379/11")
    env.update(
        DJANGO_SETTINGS_MODULE="chorus.settings",
        CHORUS_DATA_DIR=data_dir,
        CHORUS_STORAGE="local",
        CHORUS_STORAGE_ROOT=str(Path(data_dir) / "storage"),
        CHORUS_LOG_LEVEL="WARNING",  # a log line per job is not the subject
    )
    if backend == "postgresql":
        env["DATABASE_URL"] = pg_url
    return env


def django_setup() -> None:
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


# --- the parent: one run per backend, then the table ------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=5_000)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--pg-url", default=PG_URL)
    parser.add_argument("--run", choices=["sqlite", "postgresql"], help=argparse.SUPPRESS)
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        probe()
        return
    if args.run:
        print(json.dumps(run(items=args.items)))
        return
    rows = []
    for backend in args.backends.split(","):
        data_dir = tempfile.mkdtemp(prefix=f"chorus-batch-bench-{backend}-")
        if backend == "postgresql":
            ensure_database(args.pg_url)
        result = subprocess.run(
            [sys.executable, __file__, "--run", backend, "--items", str(args.items)],
            cwd=ROOT,
            env=backend_env(backend, args.pg_url, data_dir),
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            sys.exit(f"{backend} run failed:\n{result.stderr[-4000:]}")
        rows.append({"backend": backend, **json.loads(result.stdout.strip().splitlines()[-1])})
    print_table(rows, items=args.items)


def ensure_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def print_table(rows: list[dict[str, Any]], *, items: int) -> None:
    print(f"\nOne batch of {items} items; another tenant submits every {SUBMIT_EVERY_S} s.\n")
    header = (
        "| backend | admission s | longest lock wait s | bob submits | bob p50 ms "
        "| bob max ms | bob failures |"
    )
    print(header)
    print("|" + "---|" * header.count(" | ") + "---|")
    for row in rows:
        failures = ", ".join(f"{code} x{n}" for code, n in row["bob_failures"].items()) or "0"
        print(
            f"| {row['backend']} | {row['admission_s']:.2f} | {row['lock_wait_max_s']:.2f} "
            f"| {row['bob_submits']} | {row['bob_p50_ms']:.0f} | {row['bob_max_ms']:.0f} "
            f"| {failures} |"
        )


# --- one backend: set up, admit the batch with the prober running -----------------


def run(*, items: int) -> dict[str, Any]:
    django_setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    alice, bob = reset()
    from batches.services import ItemSpec, batch_create
    from synthesis.speech_request import SpeechRequest

    specs = [
        ItemSpec(
            speech=SpeechRequest(
                text=f"Item {n} of the bench batch: a sentence of an ordinary length."
            )
        )
        for n in range(items)
    ]
    env = {**os.environ, "BENCH_ALICE": str(alice.pk), "BENCH_BOB": str(bob.pk)}
    prober = subprocess.Popen(
        [sys.executable, __file__, "--probe"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert prober.stdout is not None
    assert prober.stdin is not None
    assert prober.stdout.readline().strip() == "ready"
    time.sleep(1.0)  # a few probes before, as a baseline
    started = time.perf_counter()
    batch = batch_create(tenant=alice, api_key=None, items=specs, priority="low")
    admission_s = time.perf_counter() - started
    time.sleep(1.0)
    prober.stdin.close()
    probed = json.loads(prober.stdout.read().strip().splitlines()[-1])
    prober.wait(timeout=60)
    assert batch.items.count() == items
    return {"admission_s": admission_s, **probed}


def reset() -> tuple[Any, Any]:
    from bench_tenants import forget_bench_tenants  # this folder's (first on the path)
    from django.conf import settings

    from chorus.redis_client import get_redis
    from tenants.models import Plan
    from tenants.services import tenant_create

    client = get_redis()
    assert client is not None
    client.delete(*settings.SYNTH_QUEUES, "light")
    forget_bench_tenants()
    tenants = []
    for slug in ("bench-alice", "bench-bob"):
        tenant = tenant_create(slug=slug, plan=Plan.objects.get(name="enterprise"))
        tenant.limit_overrides = {"max_concurrent_jobs": 100_000, "monthly_characters": 10**9}
        tenant.save(update_fields=["limit_overrides"])
        tenants.append(tenant)
    return tenants[0], tenants[1]


# --- the prober, a process of its own (no GIL shared with the admission) ----------


def probe() -> None:
    django_setup()
    from django.db import OperationalError, connection, transaction

    from chorus.errors import ChorusError
    from synthesis.services.jobs import job_create
    from synthesis.speech_request import SpeechRequest
    from tenants.locks import tenant_lock
    from tenants.models import Tenant

    alice_id = int(os.environ["BENCH_ALICE"])
    bob = Tenant.objects.select_related("plan").get(pk=int(os.environ["BENCH_BOB"]))
    stop = threading.Event()
    lock_waits: list[float] = []
    submits: list[float] = []
    failures: dict[str, int] = {}

    def lock_loop() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                with transaction.atomic():  # SQLite: BEGIN IMMEDIATE, the write lock
                    tenant_lock(alice_id)
            except OperationalError:  # SQLite gave up waiting (20 s): still a wait
                pass
            lock_waits.append(time.perf_counter() - started)
            time.sleep(PROBE_PAUSE_S)
        connection.close()

    def submit_loop() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                job_create(
                    tenant=bob, api_key=None, speech=SpeechRequest(text="A single job meanwhile.")
                )
            except ChorusError as exc:
                failures[exc.code] = failures.get(exc.code, 0) + 1
            except Exception as exc:  # what a request would answer 503 service_busy to
                name = type(exc).__name__
                failures[name] = failures.get(name, 0) + 1
            submits.append(time.perf_counter() - started)
            time.sleep(SUBMIT_EVERY_S)
        connection.close()

    # Warm: the first submit of a process imports, connects and prepares.
    job_create(tenant=bob, api_key=None, speech=SpeechRequest(text="A single job before."))
    threads = [threading.Thread(target=lock_loop), threading.Thread(target=submit_loop)]
    for thread in threads:
        thread.start()
    print("ready", flush=True)
    sys.stdin.read()  # until the parent closes it
    stop.set()
    for thread in threads:
        thread.join()
    print(
        json.dumps(
            {
                "lock_wait_max_s": max(lock_waits),
                "bob_submits": len(submits),
                "bob_p50_ms": statistics.median(submits) * 1000,
                "bob_max_ms": max(submits) * 1000,
                "bob_failures": failures,
            }
        )
    )


if __name__ == "__main__":
    main()
