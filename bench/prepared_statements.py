"""What preparing the request path's statements saves (`chorus.statements`).

Submits (`POST /v1/speech`) and polls of a held-back job through Django's test
client, in this process, on PostgreSQL and Redis: no server, so nothing but the
request's own work runs. Each round runs in a fresh process, alternately with
`CHORUS_DB_PREPARED_STATEMENTS` off (every statement sent as written, planned on
every run) and on (planned once per connection). Printed, medians over rounds:
CPU per request of this process and of the database's PostgreSQL backends
(utime + stime from /proc; CPU time, which other work on the host disturbs far
less than wall time), and the machine's reference loop (`bench/admission.py`).

  DATABASE_URL=postgres://postgres@127.0.0.1:5432/chorus_admission_bench \\
  REDIS_URL=redis://127.0.0.1:6379/12 .venv/bin/python bench/prepared_statements.py \\
    [--requests 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/chorus_admission_bench")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/12")
os.environ.setdefault("CHORUS_LOG_LEVEL", "WARNING")
os.environ["CHORUS_TENANT_BROKER_SLOTS"] = "2"  # the production default
os.environ["CHORUS_API_KEY_CACHE_S"] = "5"  # as in production
import harness
from admission import Sampler, reference_loop_ms, reset_jobs

BODY = harness.ADMISSION_BODY
TENANTS = 100


def database_pids() -> list[int]:
    """The client backends of this database, this process's own included (its
    requests run on it); not autovacuum, which a thousand inserts may wake."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND backend_type = 'client backend'"
        )
        return [row[0] for row in cursor.fetchall()]


def one_round(kind: str, requests: int) -> dict[str, float]:
    """In this process: `requests` of `kind` (the setting comes from the
    environment)."""
    from chorus.gc_tuning import tune_for_requests

    # An empty line first: each tenant then has exactly one job held back.
    clients, urls = harness.in_process_tenants(TENANTS, before_jobs=reset_jobs)
    tune_for_requests()  # as the web processes run

    database = Sampler(database_pids())
    cpu = time.process_time()
    for i in range(requests):
        client = clients[i % TENANTS]
        if kind == "submit":
            answer = client.post("/v1/speech", BODY, content_type="application/json")
            assert answer.status_code == 202, answer.content
        else:
            answer = client.get(urls[i % TENANTS])
            assert answer.status_code == 200, answer.content
    cpu = time.process_time() - cpu
    database_s = database.used(database_pids())
    return {"cpu_ms": cpu * 1000 / requests, "db_ms": database_s * 1000 / requests}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", metavar="KIND", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_round(args.one, args.requests)))
        return

    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    loops = []
    for _ in range(args.rounds):
        loops.append(reference_loop_ms())
        for kind in ("submit", "poll"):
            for prepared in ("false", "true"):
                done = subprocess.run(
                    [sys.executable, __file__, "--requests", str(args.requests), "--one", kind],
                    env={**os.environ, "CHORUS_DB_PREPARED_STATEMENTS": prepared},
                    check=True,
                    capture_output=True,
                    text=True,
                )
                row = json.loads(done.stdout.strip().splitlines()[-1])
                results.setdefault((kind, prepared), []).append(row)
                print(kind, f"prepared={prepared}", row, file=sys.stderr)

    print(
        f"\n{args.requests} requests a round, {args.rounds} rounds, medians (range); "
        f"reference loop {min(loops):.0f}-{max(loops):.0f} ms"
    )
    print("| request | prepared | CPU ms/request, this process | PostgreSQL CPU ms/request |")
    print("| --- | --- | --- | --- |")
    for (kind, prepared), rows in results.items():
        cells = []
        for name in ("cpu_ms", "db_ms"):
            values = [row[name] for row in rows]
            cells.append(f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
        print(f"| {kind} | {'on' if prepared == 'true' else 'off'} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
