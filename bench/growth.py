"""Does a request cost the same at a million jobs as at the first?

Fills PostgreSQL with history the way the services write it (jobs in every final
state, spread over 90 days, audio past its retention marked deleted; a reserve and
a commit or refund in the ledger for each; usage periods and storage counters as
the services keep them), in steps (default 0, 100k, 1M job rows; half of them one
tenant's, the rest spread over 99 others), and at each size with standing lines of
waiting jobs (`--waiting`, default 0, 10,000 and 100,000 `normal` jobs of the
other tenants, two each in the broker and the rest pending, plus the measured
tenant's own two queued and one pending). At each size and line it times, over
real HTTP against uvicorn and a real worker (synthetic engine, no delays), as
the tenant holding half the rows:

  submit      POST /v1/speech (low: it goes straight to the worker)
  poll        GET /v1/speech/{id} of one of its pending jobs (place in line, estimate)
  list        GET /v1/speech, first page of 20
  deep        GET /v1/speech, a page a quarter of the way down (the cursor)
  offset      the legacy `offset` at that depth, or at the deepest it is answered
              (`MAX_OFFSET`, 10,000) where that is shallower: it costs what it skips
  usage       GET /v1/usage
  pickup      a `high` job: submitted -> started by the worker (server clocks)
  sweep       one sweeper pass (in this process), counters recently recounted
  recount     the hourly recount of the big tenant's counters (storage, periods)
  voice       POST /v1/voices, a 5 s WAV reference (deleted again, untimed)
  admin_jobs  the admin's list of every job, as staff (session cookie)
  overview    /admin/, the operator's overview, as staff

and prints medians, each ratio to the empty database with no line, and at the
largest size and line the plan (EXPLAIN ANALYZE) of every query those requests
and a sweeper pass make (also in bench/out/growth_plans.txt).

  DATABASE_URL=postgres://postgres@127.0.0.1:5432/chorus_growth_bench \\
  REDIS_URL=redis://127.0.0.1:6379/7 CHORUS_DATA_DIR=/tmp/chorus-growth-bench \\
    .venv/bin/python bench/growth.py [--sizes 0,100000,1000000] [--waiting 0,10000,100000]
    [--calls 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

from chorus.api.pagination import MAX_OFFSET

BIG = "growth-big"
OTHERS = 99
FILL_BATCH = 250_000
TEXT = "Growth fill: a sentence of an ordinary length."
COLUMNS = [
    "submit",
    "poll",
    "list",
    "deep",
    "offset",
    "usage",
    "pickup",
    "sweep",
    "recount",
    "voice",
    "admin_jobs",
    "overview",
]
STAFF = "growth-staff"


def reset() -> None:
    """Start from an empty history (TRUNCATE: a DELETE of millions of rows is slow)."""
    from django.conf import settings
    from django.db import connection

    from chorus.redis_client import get_redis
    from tenants.models import Tenant

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE synthesis_idempotencykey, quotas_ledgerentry, synthesis_job, "
            # CASCADE: batch items hang off jobs too.
            "quotas_usageperiod, quotas_storageusage, synthesis_workerheartbeat CASCADE"
        )
    Tenant.objects.filter(slug__startswith="growth-").delete()
    client = get_redis()
    assert client is not None
    client.delete(*settings.SYNTH_QUEUES, "unacked", "unacked_index")


def make_tenants() -> tuple[Any, str, list[Any]]:
    from django.utils import timezone

    from quotas.services import usage_period_current

    big, key = harness.http_tenant(BIG)
    others = [harness.http_tenant(f"growth-{n:02d}")[0] for n in range(OTHERS)]
    now = timezone.now()
    for tenant in [big, *others]:  # the periods the 90 days of history fall in
        for days in range(0, 100, 10):
            usage_period_current(tenant=tenant, now=now - timedelta(days=days))
    return big, key, others


def fill(*, rows: int, big_id: int, other_ids: list[int], retention_days: int) -> None:
    """`rows` more finished jobs, half the big tenant's, each with its ledger."""
    from django.db import connection

    others = "ARRAY[" + ",".join(map(str, other_ids)) + "]"
    done = 0
    while done < rows:
        n = min(FILL_BATCH, rows - done)
        tenant = f"CASE WHEN g %% 2 = 0 THEN {big_id} ELSE ({others})[1 + (g / 2) %% {OTHERS}] END"
        sql = f"""
        WITH src AS (
            SELECT gen_random_uuid() AS id, {tenant} AS tenant_id,
                   (ARRAY['high','normal','normal','low'])[1 + g %% 4] AS priority,
                   CASE WHEN g %% 100 < 90 THEN 'succeeded'
                        WHEN g %% 100 < 97 THEN 'failed' ELSE 'cancelled' END AS status,
                   now() - random() * interval '90 days' - interval '10 minutes' AS created
            FROM generate_series(1, %(n)s) g
        ), ins AS (
            INSERT INTO synthesis_job (
                id, tenant_id, api_key_id, voice_id, voice_name, text, characters, priority,
                format, speed, requested_sample_rate, stream, instruction, prompt_source,
                prompt_seconds, status, attempts, epoch, published_at, error_code,
                error_message, engine, worker, output_key, output_bytes, output_deleted_at,
                sample_rate, duration_s, created_at, started_at, first_audio_at, finished_at,
                language, reuse_key)
            SELECT id, tenant_id, NULL, NULL, '', %(text)s, %(chars)s, priority,
                'wav', 1.0, NULL, false, '', '', NULL, status, 1, 1, created,
                CASE status WHEN 'failed' THEN 'engine_error'
                            WHEN 'cancelled' THEN 'cancelled' ELSE '' END,
                CASE status WHEN 'succeeded' THEN '' ELSE 'Filled.' END,
                'synthetic', 'fill',
                CASE status WHEN 'succeeded' THEN 'speech/' || id || '.wav' ELSE '' END,
                CASE status WHEN 'succeeded' THEN 96044 END,
                -- Expired audio is marked deleted, as the sweeper leaves it; the
                -- last hour past retention is still due (a pass's worth).
                CASE WHEN status = 'succeeded'
                      AND created < now() - %(retention)s - interval '1 hour'
                     THEN created + %(retention)s END,
                CASE status WHEN 'succeeded' THEN 24000 END,
                CASE status WHEN 'succeeded' THEN 2.0 END,
                created, created + interval '20 ms', created + interval '220 ms',
                created + interval '2 s', '', ''
            FROM src
            RETURNING id, tenant_id, status, created_at, characters
        ), periods AS (
            SELECT ins.*, p.id AS period_id FROM ins JOIN quotas_usageperiod p
              ON p.tenant_id = ins.tenant_id
             AND ins.created_at >= p.starts_at AND ins.created_at < p.ends_at
        ), reserve AS (
            INSERT INTO quotas_ledgerentry (tenant_id, period_id, job_id, kind, characters,
                                            created_at)
            SELECT tenant_id, period_id, id, 'reserve', characters, created_at FROM periods
        )
        INSERT INTO quotas_ledgerentry (tenant_id, period_id, job_id, kind, characters,
                                        created_at)
        SELECT tenant_id, period_id, id,
               CASE status WHEN 'succeeded' THEN 'commit' ELSE 'refund' END, characters,
               created_at + interval '2 s'
        FROM periods
        """
        with connection.cursor() as cursor:
            cursor.execute(
                sql,
                {
                    "n": n,
                    "text": TEXT,
                    "chars": len(TEXT),
                    "retention": timedelta(days=retention_days),
                },
            )
        done += n
        print(f"  filled {done:,} of {rows:,}", file=sys.stderr)


def add_waiting(*, waiting: int, big_id: int, other_ids: list[int]) -> None:
    """The standing line: two `queued` (as if in the broker) and the rest `pending`
    per tenant, all `normal`; the big tenant has two queued and one pending."""
    from django.db import connection

    def insert(tenant_id: int, status: str, count: int) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                """
                WITH ins AS (
                  INSERT INTO synthesis_job (
                    id, tenant_id, voice_name, text, characters, priority, format, speed,
                    stream, instruction, prompt_source, status, attempts, epoch, published_at,
                    error_code, error_message, engine, worker, output_key, created_at,
                    language, reuse_key)
                  SELECT gen_random_uuid(), %(t)s, '', %(text)s, %(chars)s, 'normal', 'wav',
                    1.0, false, '', '', %(status)s, 0, 1,
                    CASE WHEN %(status)s = 'queued' THEN now() END, '', '', '', '', '',
                    now() - interval '1 second' * g, '', ''
                  FROM generate_series(1, %(n)s) g
                  RETURNING id, tenant_id, characters, created_at)
                INSERT INTO quotas_ledgerentry (tenant_id, period_id, job_id, kind,
                                                characters, created_at)
                SELECT ins.tenant_id, p.id, ins.id, 'reserve', ins.characters, ins.created_at
                FROM ins JOIN quotas_usageperiod p ON p.tenant_id = ins.tenant_id
                 AND ins.created_at >= p.starts_at AND ins.created_at < p.ends_at
                """,
                {"t": tenant_id, "status": status, "n": count, "text": TEXT, "chars": len(TEXT)},
            )

    per_tenant = max(3, waiting // len(other_ids))
    for tenant_id in other_ids if waiting else []:
        insert(tenant_id, "queued", 2)
        insert(tenant_id, "pending", per_tenant - 2)
    insert(big_id, "queued", 2)
    insert(big_id, "pending", 1)


def clear_waiting() -> None:
    """Take the standing line away (with its reservations), to lay another."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM quotas_ledgerentry WHERE job_id IN "
            "(SELECT id FROM synthesis_job WHERE status IN ('pending', 'queued'))"
        )
        cursor.execute("DELETE FROM synthesis_job WHERE status IN ('pending', 'queued')")


def settle_counters() -> None:
    """Period and storage counters as the services would have left them."""
    from django.db import connection
    from django.utils import timezone

    from quotas.counters import storage_recount
    from quotas.models import StorageUsage
    from tenants.models import Tenant

    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE quotas_usageperiod p SET
              characters_used = s.used, characters_reserved = s.reserved,
              jobs_succeeded = s.ok, jobs_failed = s.failed, jobs_cancelled = s.cancelled,
              audio_ms = s.audio
            FROM (
              SELECT l.period_id,
                SUM(CASE WHEN l.kind = 'commit' THEN l.characters ELSE 0 END) AS used,
                SUM(CASE l.kind WHEN 'reserve' THEN l.characters ELSE -l.characters END)
                  AS reserved,
                COUNT(*) FILTER (WHERE l.kind = 'commit') AS ok,
                COUNT(*) FILTER (WHERE l.kind = 'refund' AND j.status <> 'cancelled')
                  AS failed,
                COUNT(*) FILTER (WHERE l.kind = 'refund' AND j.status = 'cancelled')
                  AS cancelled,
                COALESCE(SUM(CASE WHEN l.kind = 'commit' THEN ROUND(j.duration_s * 1000)
                             END), 0) AS audio
              FROM quotas_ledgerentry l JOIN synthesis_job j ON j.id = l.job_id
              GROUP BY l.period_id) s
            WHERE p.id = s.period_id
            """
        )
    for tenant_id in Tenant.objects.filter(slug__startswith="growth-").values_list("pk", flat=True):
        StorageUsage.objects.update_or_create(
            tenant_id=tenant_id,
            defaults={
                "bytes_used": storage_recount(tenant_id=tenant_id),
                "reconciled_at": timezone.now(),
            },
        )


def vacuum() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        for table in ("synthesis_job", "quotas_ledgerentry", "quotas_usageperiod"):
            cursor.execute(f"VACUUM ANALYZE {table}")


def median_ms(call: Callable[[], Any], n: int, before: Callable[[], Any] | None = None) -> float:
    samples = []
    for _ in range(n):
        if before is not None:
            before()
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def cursor_at(big_id: int, depth: int) -> str:
    from chorus.api.pagination import _Cursor
    from synthesis.models import Job

    row = (
        Job.objects.filter(tenant_id=big_id)
        .order_by("-created_at", "-id")
        .values_list("created_at", "id")[depth : depth + 1]
        .first()
    )
    if row is None:
        return ""
    return _Cursor(row[0], row[1], older=True).encode()


def reference_wav() -> bytes:
    """A 5 s mono tone at 22.05 kHz: a voice reference as uploads send it."""
    import io

    import numpy as np
    import soundfile as sf

    rate = 22050
    t = np.arange(5 * rate) / rate
    buffer = io.BytesIO()
    sf.write(buffer, 0.3 * np.sin(2 * np.pi * 220 * t), rate, format="WAV")
    return buffer.getvalue()


def staff_cookie() -> str:
    """A logged-in staff session's cookie (a superuser made for the bench)."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    users = get_user_model().objects
    user = users.filter(username=STAFF).first() or users.create_superuser(STAFF, "", None)
    client = Client()
    client.force_login(user)
    return str(client.cookies["sessionid"].value)


def measure(*, url: str, key: str, big_id: int, rows: int, calls: int) -> dict[str, float]:

    from synthesis.models import Job
    from synthesis.services.sweeper import sweep

    keep_line()
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {key}"
    staff = requests.Session()
    staff.cookies.set("sessionid", staff_cookie())
    wav = reference_wav()
    uploaded: list[str] = []
    waiting = Job.objects.filter(tenant_id=big_id, status="pending").values_list("pk", flat=True)
    poll_id = waiting.first()
    depth = max(0, rows // 2 // 4)
    cursor = cursor_at(big_id, depth)

    def ok(response: requests.Response) -> None:
        assert response.status_code < 300, (response.status_code, response.text[:300])

    def submit() -> None:
        ok(http.post(f"{url}/v1/speech", json={"text": "Growth bench.", "priority": "low"}))

    def pickup_once() -> float:
        response = http.post(f"{url}/v1/speech", json={"text": "Now.", "priority": "high"})
        ok(response)
        job_id = response.json()["id"]
        deadline = time.monotonic() + 30
        while True:
            job = Job.objects.filter(pk=job_id).values("created_at", "started_at").first()
            if job and job["started_at"]:
                return (job["started_at"] - job["created_at"]).total_seconds() * 1000
            if time.monotonic() > deadline:
                raise RuntimeError("the worker did not pick the job up")
            time.sleep(0.005)

    def upload() -> None:
        response = http.post(
            f"{url}/v1/voices",
            data={"name": "growth"},
            files={"audio": ("reference.wav", wav, "audio/wav")},
        )
        ok(response)
        uploaded.append(response.json()["id"])

    def forget_voices() -> None:  # untimed: the plan keeps only so many voices
        while uploaded:
            ok(http.delete(f"{url}/v1/voices/{uploaded.pop()}"))

    def admin_page(path: str) -> None:
        response = staff.get(f"{url}{path}", allow_redirects=False)
        assert response.status_code == 200, (path, response.status_code)

    submit()  # warm the connection and the tenant's counters
    admin_page("/admin/")
    figures = {
        "submit": median_ms(submit, calls),
        "poll": median_ms(lambda: ok(http.get(f"{url}/v1/speech/{poll_id}")), calls),
        "list": median_ms(lambda: ok(http.get(f"{url}/v1/speech")), calls),
        "deep": median_ms(
            lambda: ok(http.get(f"{url}/v1/speech", params={"cursor": cursor} if cursor else {})),
            calls,
        ),
        "offset": median_ms(
            lambda: ok(http.get(f"{url}/v1/speech", params={"offset": min(depth, MAX_OFFSET)})),
            calls,
        ),
        "usage": median_ms(lambda: ok(http.get(f"{url}/v1/usage")), calls),
        "pickup": statistics.median(pickup_once() for _ in range(calls)),
        "sweep": median_ms(sweep, max(3, calls // 6), before=keep_line),
        "recount": median_ms(lambda: recount(big_id), 3),
        "voice": median_ms(upload, max(5, calls // 3), before=forget_voices),
        "admin_jobs": median_ms(lambda: admin_page("/admin/synthesis/job/"), max(5, calls // 3)),
        "overview": median_ms(lambda: admin_page("/admin/"), max(5, calls // 3)),
    }
    forget_voices()
    http.close()
    staff.close()
    return figures


def keep_line() -> None:
    """The standing line's queued jobs never reached a broker: stamp them as just
    published, or the sweeper takes them for lost messages and publishes them (the
    worker would then work the whole line off)."""
    from django.utils import timezone

    from synthesis.models import Job

    Job.objects.filter(status="queued").update(published_at=timezone.now())


def recount(tenant_id: int) -> None:
    from quotas.counters import counters_reconcile
    from quotas.models import StorageUsage

    StorageUsage.objects.filter(tenant_id=tenant_id).update(reconciled_at=None)
    counters_reconcile(batch=1)


def explain_all(*, key: str, big_id: int, rows: int) -> str:
    """EXPLAIN ANALYZE of every SELECT the measured requests and a sweep make."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from synthesis.models import Job
    from synthesis.services.sweeper import sweep

    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}", SERVER_NAME="127.0.0.1")
    staff = Client(SERVER_NAME="127.0.0.1")
    staff.force_login(get_user_model().objects.get(username=STAFF))
    wav = reference_wav()

    def upload() -> None:
        from django.core.files.uploadedfile import SimpleUploadedFile

        answer = client.post(
            "/v1/voices",
            {"name": "plan", "audio": SimpleUploadedFile("r.wav", wav, "audio/wav")},
        )
        client.delete(f"/v1/voices/{answer.json()['id']}")

    poll_id = Job.objects.filter(tenant_id=big_id, status="pending").values_list("pk").first()
    depth = max(0, rows // 2 // 4)
    cursor = cursor_at(big_id, depth)
    steps: list[tuple[str, Callable[[], Any]]] = [
        (
            "submit",
            lambda: client.post(
                "/v1/speech", {"text": "Plan.", "priority": "low"}, content_type="application/json"
            ),
        ),
        ("poll", lambda: client.get(f"/v1/speech/{poll_id[0] if poll_id else ''}")),
        ("list", lambda: client.get("/v1/speech")),
        ("deep", lambda: client.get("/v1/speech", {"cursor": cursor} if cursor else {})),
        ("usage", lambda: client.get("/v1/usage")),
        ("sweep", lambda: (keep_line(), sweep())),
        ("recount", lambda: recount(big_id)),
        ("voice", upload),
        ("admin_jobs", lambda: staff.get("/admin/synthesis/job/")),
        ("overview", lambda: staff.get("/admin/")),
    ]
    out = []
    for name, step in steps:
        with CaptureQueriesContext(connection) as queries:
            step()
        out.append(f"=== {name}: {len(queries)} statements")
        for query in queries:
            sql = query["sql"]
            if not sql.lstrip().upper().startswith("SELECT"):
                out.append(f"--- ({query['time']} s) {sql[:160]}")
                continue
            with connection.cursor() as c:
                c.execute(f"EXPLAIN (ANALYZE, COSTS OFF) {sql}")
                plan = [row[0] for row in c.fetchall()]
            out.append(f"--- {sql[:300]}")
            out.extend(f"    {line}" for line in plan)
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="0,100000,1000000")
    parser.add_argument("--waiting", default="0,10000,100000", help="standing lines to time")
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep the history a previous run filled (and fill on from there) instead of "
        "starting empty; the standing line is laid again",
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    lines = [int(s) for s in args.waiting.split(",")]

    os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/chorus_growth_bench")
    os.environ["CHORUS_TENANT_BROKER_SLOTS"] = "2"
    harness.ensure_database()
    import django

    django.setup()
    from django.core.management import call_command
    from django.utils import timezone

    from quotas.models import StorageUsage

    call_command("migrate", verbosity=0)
    from synthesis.models import Job

    filled = 0
    if args.reuse and Job.objects.filter(worker="fill").exists():
        big, key = harness.http_tenant(BIG)
        others = [harness.http_tenant(f"growth-{n:02d}")[0] for n in range(OTHERS)]
        filled = Job.objects.filter(worker="fill").count()
        clear_waiting()  # the earlier line, worked off or not; new ones are laid
    else:
        reset()
        big, key, others = make_tenants()
    other_ids = [t.pk for t in others]
    if not args.reuse:
        settle_counters()
    StorageUsage.objects.update(reconciled_at=timezone.now())
    vacuum()

    results: dict[tuple[int, int], dict[str, float]] = {}
    plans = ""
    with harness.quiet_web() as (_, port):
        url = f"http://127.0.0.1:{port}"
        with harness.workers(1, {"first_chunk_delay_s": 0.0, "rtf": 0.0}):
            for size in sizes:
                if size > filled:
                    t0 = time.monotonic()
                    fill(
                        rows=size - filled,
                        big_id=big.pk,
                        other_ids=other_ids,
                        retention_days=big.plan.output_retention_days,
                    )
                    settle_counters()
                    vacuum()
                    filled = size
                    print(f"filled to {size:,} in {time.monotonic() - t0:.0f} s", file=sys.stderr)
                for waiting in lines:
                    lay_line(waiting=waiting, big_id=big.pk, other_ids=other_ids)
                    figures = measure(url=url, key=key, big_id=big.pk, rows=size, calls=args.calls)
                    results[(size, waiting)] = figures
                    rounded = {k: round(v, 1) for k, v in figures.items()}
                    print(size, waiting, rounded, file=sys.stderr)
            plans = explain_all(key=key, big_id=big.pk, rows=sizes[-1])
    print_table(results)
    harness.OUT.mkdir(parents=True, exist_ok=True)
    path = harness.OUT / "growth_plans.txt"
    path.write_text(plans + "\n")
    print(f"\nPlans at {sizes[-1]:,} job rows and {lines[-1]:,} waiting ({path}):\n")
    print(plans)


def lay_line(*, waiting: int, big_id: int, other_ids: list[int]) -> None:
    """A standing line of `waiting` jobs instead of the last one, the planner told."""
    from django.db import connection

    clear_waiting()
    add_waiting(waiting=waiting, big_id=big_id, other_ids=other_ids)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE synthesis_job")


def print_table(results: dict[tuple[int, int], dict[str, float]]) -> None:
    """Medians, and each one's ratio to the empty database with no line."""
    base = results[min(results)]
    print("| job rows | waiting | " + " | ".join(COLUMNS) + " |")
    print("| --- | --- |" + " --- |" * len(COLUMNS))
    for (size, waiting), figures in sorted(results.items()):
        cells = []
        for column in COLUMNS:
            value = figures[column]
            ratio = value / base[column] if base[column] else float("nan")
            cells.append(
                f"{value:.1f} ms"
                if (size, waiting) == min(results)
                else f"{value:.1f} (x{ratio:.2f})"
            )
        print(f"| {size:,} | {waiting:,} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
