"""The operator's overview at a million jobs: how long its queries and the whole
admin landing page take, and the plan PostgreSQL picks for each query.

Fills a PostgreSQL database of its own (default `chorus_overview_bench`) with
rows shaped as the services write them: 200 tenants on three plans, their billing
periods for the past seven months, worker heartbeats (8 alive, 300 long dead),
and --jobs job rows: most finished over the past six months (95 % succeeded,
4 % failed with an error code, 1 % cancelled), --last-hour of them finished in
the last hour, 2,000 waiting (pending and queued) and 40 running. Then it times
each of the overview's queries and the rendered page (median of --repeat runs,
after one warm-up) and prints the table and every query's EXPLAIN ANALYZE.

  .venv/bin/python bench/overview.py [--jobs 1000000] [--last-hour 12000] [--repeat 10]
      [--reuse]   # keep the rows of an earlier run of the same size

REDIS_URL (default redis db 12) holds the queued jobs' messages, for LLEN.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chorus.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/chorus_overview_bench")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/12")
os.environ.setdefault("CHORUS_DATA_DIR", str(Path(tempfile.gettempdir()) / "chorus-overview-bench"))
sys.path.insert(0, str(ROOT / "bench"))

from harness import ensure_database  # noqa: E402  (after this bench's own defaults)

TENANTS = 200
WAITING = 2_000
RUNNING = 40
ERRORS = ("engine_error", "voice_deleted", "storage_unavailable", "worker_lost", "internal_error")
WORKERS = [f"gpu-{i}:{1000 + i}" for i in range(8)]
JOB_COLUMNS = [
    "id",
    "tenant_id",
    "voice_name",
    "text",
    "characters",
    "priority",
    "format",
    "speed",
    "stream",
    "instruction",
    "prompt_source",
    "status",
    "attempts",
    "epoch",
    "published_at",
    "error_code",
    "error_message",
    "engine",
    "worker",
    "output_key",
    "output_bytes",
    "sample_rate",
    "duration_s",
    "created_at",
    "started_at",
    "first_audio_at",
    "finished_at",
]


def _job_row(rng: random.Random, tenant_ids: list[int], now: datetime, kind: str) -> tuple:
    """One job as the services leave it: `kind` is finished, recent, waiting or running."""
    # A few tenants send most of the work, as on a real service.
    tenant = tenant_ids[min(int(rng.paretovariate(1.2)) - 1, len(tenant_ids) - 1)]
    chars = rng.randint(20, 300)
    priority = rng.choices(("high", "normal", "low"), (1, 6, 3))[0]
    if kind == "finished":
        created = now - timedelta(seconds=rng.uniform(3600, 180 * 86400))
    elif kind == "recent":
        created = now - timedelta(seconds=rng.uniform(5, 3600))
    elif kind == "running":
        created = now - timedelta(seconds=rng.uniform(1, 30))
    else:
        created = now - timedelta(seconds=rng.uniform(0, 600))
    status, started, first, finished, error_code, error_message = "queued", None, None, None, "", ""
    worker, engine, output_key, output_bytes, rate, duration = "", "", "", None, None, None
    wait = rng.expovariate(1 / {"high": 0.3, "normal": 2.0, "low": 8.0}[priority])
    if kind in ("finished", "recent", "running"):
        started = created + timedelta(seconds=wait)
        worker, engine = rng.choice(WORKERS), "cosyvoice2"
        first = started + timedelta(seconds=rng.uniform(0.15, 0.6))
        status = "running"
    if kind in ("finished", "recent"):
        duration = round(chars * 0.06, 3)
        finished = first + timedelta(seconds=duration * rng.uniform(0.1, 0.3))
        if kind == "recent" and finished > now:
            finished = now - timedelta(seconds=rng.uniform(0, 5))
        status = rng.choices(("succeeded", "failed", "cancelled"), (95, 4, 1))[0]
        if status == "succeeded":
            output_bytes, rate = int(duration * 48_000), 24_000
        elif status == "failed":
            error_code = rng.choice(ERRORS)
            error_message = "The job failed."
    elif kind == "waiting":
        status = rng.choice(("pending", "queued"))
    job_id = uuid.uuid4()
    if output_bytes:
        output_key = f"speech/{job_id}.wav"
    return (
        job_id,
        tenant,
        "",
        "x" * chars,
        chars,
        priority,
        "wav",
        1.0,
        False,
        "",
        "",
        status,
        1 if started else 0,
        1 if status != "pending" else 0,
        created if status != "pending" else None,
        error_code,
        error_message,
        engine,
        worker,
        output_key,
        output_bytes,
        rate,
        duration,
        created,
        started,
        first,
        finished,
    )


def fill(*, jobs: int, last_hour: int, seed: int = 7) -> None:
    from django.db import connection
    from django.utils import timezone

    from quotas.models import UsagePeriod
    from quotas.periods import billing_period
    from synthesis.models import Job, WorkerHeartbeat
    from tenants.models import Plan, Tenant

    rng = random.Random(seed)
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE synthesis_job, synthesis_workerheartbeat, quotas_usageperiod, "
            "tenants_tenant, tenants_plan RESTART IDENTITY CASCADE"
        )
    plans = [Plan.objects.create(name=name) for name in ("free", "pro", "enterprise")]
    Tenant.objects.bulk_create(
        Tenant(
            slug=f"tenant-{i:03d}",
            name=f"Tenant {i}",
            plan=plans[i % 3],
            bucket=f"chorus-tenant-{i:03d}",
            billing_anchor=datetime(2025, 1, 1 + i % 28, tzinfo=UTC).date(),
        )
        for i in range(TENANTS)
    )
    tenants = list(Tenant.objects.order_by("id"))
    tenant_ids = [t.id for t in tenants]
    UsagePeriod.objects.bulk_create(
        UsagePeriod(
            tenant=t,
            starts_at=s,
            ends_at=e,
            characters_used=rng.randint(0, 5_000_000),
            jobs_succeeded=rng.randint(0, 30_000),
        )
        for t in tenants
        for s, e in {
            billing_period(t.billing_anchor, now - timedelta(days=30 * m)) for m in range(7)
        }
    )
    beats = [
        WorkerHeartbeat(
            name=name,
            engine="cosyvoice2",
            device=f"cuda:{i % 2}",
            memory_bytes=5 * 2**30,
            slots=7,
            slots_busy=rng.randint(0, 7),
            jobs_done=rng.randint(1_000, 50_000),
            jobs_failed=rng.randint(0, 500),
            started_at=now - timedelta(days=3),
            seen_at=now,
        )
        for i, name in enumerate(WORKERS)
    ] + [
        WorkerHeartbeat(
            name=f"gpu-old-{i}:{i}",
            engine="cosyvoice2",
            device="cuda:0",
            started_at=now - timedelta(days=40),
            seen_at=now - timedelta(days=rng.uniform(2, 40)),
        )
        for i in range(300)
    ]
    WorkerHeartbeat.objects.bulk_create(beats)

    kinds = (
        ["finished"] * (jobs - last_hour - WAITING - RUNNING)
        + ["recent"] * last_hour
        + ["waiting"] * WAITING
        + ["running"] * RUNNING
    )
    started = time.perf_counter()
    # Through the model, not COPY with a column list: a column added since (with its
    # default) does not break the bench. Slower than COPY (20,000 rows in 10 s on a shared
    # 2-core machine); --reuse keeps the rows of an earlier run.
    batch: list[Job] = []
    for kind in kinds:
        batch.append(
            Job(**dict(zip(JOB_COLUMNS, _job_row(rng, tenant_ids, now, kind), strict=True)))
        )
        if len(batch) == 10_000:
            Job.objects.bulk_create(batch)
            batch = []
    Job.objects.bulk_create(batch)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    print(f"inserted {len(kinds):,} jobs in {time.perf_counter() - started:.0f} s", flush=True)
    _fill_broker()


def _fill_broker() -> None:
    from django.conf import settings

    from chorus.redis_client import get_redis
    from synthesis.models import Job

    client = get_redis()
    assert client is not None
    client.delete(*settings.SYNTH_QUEUES)
    for priority in ("high", "normal", "low"):
        n = Job.objects.filter(status="queued", priority=priority).count()
        if n:
            client.lpush(f"synth.{priority}", *[b"{}"] * n)


def median_ms(fn: Callable[[], Any], repeat: int) -> float:
    fn()  # warm-up: connections, caches, template compilation
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--last-hour", type=int, default=12_000)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--reuse", action="store_true")
    args = parser.parse_args()
    ensure_database()
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from synthesis import overview
    from synthesis.models import Job

    call_command("migrate", verbosity=0)
    if not (args.reuse and Job.objects.count() == args.jobs):
        fill(jobs=args.jobs, last_hour=args.last_hour)
    user = get_user_model().objects.filter(username="bench").first()
    if user is None:
        user = get_user_model().objects.create_superuser("bench", "bench@example.com", "bench")
    client = Client()
    client.force_login(user)

    now = timezone.now()
    finished = sum(overview.overview_read(now=now).finished.values())
    # The service's own list of the overview's queries (one bench, no private names).
    parts: list[tuple[str, Callable[[], Any]]] = [
        *overview.overview_parts(now=now),
        ("overview_read() (all of the above)", overview.overview_read),
        ("GET /admin/ (the whole page, rendered)", lambda: client.get("/admin/")),
    ]
    print(f"\n{finished:,} jobs finished in the last hour")
    assert client.get("/admin/").status_code == 200
    print(
        f"\nOverview at {Job.objects.count():,} job rows (PostgreSQL), median of {args.repeat}:\n"
    )
    print(f"| {'part':<58} | {'ms':>8} |")
    print(f"| {'-' * 58} | {'-' * 8}:|")
    for name, fn in parts:
        print(f"| {name:<58} | {median_ms(fn, args.repeat):8.1f} |", flush=True)

    with CaptureQueriesContext(connection) as captured:
        overview.overview_read()
    print(f"\n{len(captured.captured_queries)} queries; their plans (EXPLAIN ANALYZE):")
    with connection.cursor() as cursor:
        for query in captured.captured_queries:
            sql = query["sql"]
            print(f"\n-- {sql}")
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {sql}")
            for (line,) in cursor.fetchall():
                print(f"   {line}")


if __name__ == "__main__":
    main()
