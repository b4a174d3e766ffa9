"""What a tenant's own batch in line costs its single submits.

A submit reads its tenant's line under the tenant's lock: its single jobs in
flight (the plan's jobs at once), whether one of the new job's priority is
pending, and how many of that priority are queued. A batch's items are in
flight too, and the plan's jobs at once leave them out, so a count that reads
every job in flight and sets the items aside grows with the batch.

For each size N of one batch waiting (`pending` items at `low`, two queued as
if in the broker; rows as `batches.services` writes them: the batch, its jobs,
its items), this times `POST /v1/speech` (one `normal` job, real HTTP to one
uvicorn process, on PostgreSQL) for the same tenant, sequentially, and reports
the median and p95 and the PostgreSQL CPU per submit (its backends' utime +
stime from /proc).

  DATABASE_URL=postgres://postgres@127.0.0.1:5432/chorus_admission_bench \\
  REDIS_URL=redis://127.0.0.1:6379/12 .venv/bin/python bench/batch_line.py \\
    [--items 0,1000,10000,100000] [--calls 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/chorus_admission_bench")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/12")
os.environ.setdefault("CHORUS_LOG_LEVEL", "WARNING")
import harness
from admission import Sampler, backend_pids, reset_jobs

TEXT = "One single job beside a long batch."


def lay_batch(*, tenant_id: int, items: int) -> None:
    """One batch of `items` low jobs: two queued, the rest pending."""
    from django.db import connection

    from synthesis.models import Job

    # Code from before `Job.in_batch` has no such column (an A/B run).
    marked = any(f.name == "in_batch" for f in Job._meta.get_fields())
    if not items:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO batches_batch (id, tenant_id, status, priority, item_count, characters,
              archive_status, archive_key, archive_error, created_at, idempotency_key,
              request_fingerprint)
            VALUES (gen_random_uuid(), %(t)s, 'running', 'low', %(n)s, %(n)s * 10, 'waiting',
              '', '', now(), '', '')
            RETURNING id
            """,
            {"t": tenant_id, "n": items},
        )
        [(batch_id,)] = cursor.fetchall()
        cursor.execute(
            f"""
            WITH jobs AS (
              INSERT INTO synthesis_job (
                id, tenant_id, voice_name, text, characters, priority, format, speed,
                stream, instruction, prompt_source, status, attempts, epoch, published_at,
                error_code, error_message, engine, worker, output_key, created_at,
                language, reuse_key{", in_batch" if marked else ""})
              SELECT gen_random_uuid(), %(t)s, '', 'Item ' || g, 10, 'low', 'wav', 1.0, false,
                '', '', CASE WHEN g <= 2 THEN 'queued' ELSE 'pending' END, 0, 1,
                CASE WHEN g <= 2 THEN now() END, '', '', '', '', '',
                now() - interval '1 millisecond' * (%(n)s - g), '', ''{", true" if marked else ""}
              FROM generate_series(1, %(n)s) g
              RETURNING id, text)
            INSERT INTO batches_batchitem (batch_id, index, custom_id, metadata, job_id)
            SELECT %(b)s, substr(text, 6)::int - 1, '', '{{}}', id FROM jobs
            """,
            {"t": tenant_id, "n": items, "b": batch_id},
        )
        # Vacuumed now, so that autovacuum does not work off the new rows while
        # the submits are timed (its CPU would count as theirs).
        cursor.execute("VACUUM ANALYZE synthesis_job")
        cursor.execute("VACUUM ANALYZE batches_batchitem")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", default="0,1000,10000,100000")
    parser.add_argument("--calls", type=int, default=40)
    args = parser.parse_args()

    os.environ["CHORUS_TENANT_BROKER_SLOTS"] = "2"  # the production default
    harness.ensure_database()
    import django

    django.setup()
    import httpx
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    tenant, key = harness.http_tenant("batch-line")
    rows = []
    with harness.quiet_web() as (_, port):
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers) as http:
            for items in [int(n) for n in args.items.split(",")]:
                reset_jobs()
                lay_batch(tenant_id=tenant.pk, items=items)
                for _ in range(5):  # warm: prepared statements, the key cache
                    http.post("/v1/speech", json={"text": TEXT}).raise_for_status()
                db = Sampler(backend_pids())
                took = []
                for _ in range(args.calls):
                    t0 = time.perf_counter()
                    response = http.post("/v1/speech", json={"text": TEXT})
                    took.append(time.perf_counter() - t0)
                    assert response.status_code == 202, response.text
                db_s = db.used(backend_pids())
                rows.append(
                    (
                        items,
                        statistics.median(took) * 1000,
                        harness.percentile(took, 0.95) * 1000,
                        db_s * 1000 / args.calls,
                    )
                )
                print(rows[-1], file=sys.stderr)
    print(
        f"\nOne web process, {args.calls} sequential submits a row (normal) by the tenant "
        "whose batch waits (low)"
    )
    print("| batch items waiting | submit p50 | submit p95 | PostgreSQL CPU per submit |")
    print("| --- | --- | --- | --- |")
    for items, p50, p95, db_ms in rows:
        print(f"| {items:,} | {p50:.1f} ms | {p95:.1f} ms | {db_ms:.2f} ms |")


if __name__ == "__main__":
    main()
