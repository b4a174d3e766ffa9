"""Garbage collection per request, with CPython's default thresholds and tuned.

Submits (`POST /v1/speech`) and polls of a held-back job through Django's test
client, in this process, on PostgreSQL and Redis: no server, so nothing but the
request's own work runs. Each round runs in a fresh process, alternately with
the collector as CPython sets it and as `chorus.gc_tuning` sets it for the web
processes, and times every collection (`gc.callbacks`). Printed: milliseconds
of collection per request (the median over rounds), collections of each
generation per 1,000 requests, and the process's CPU per request.

  DATABASE_URL=postgres://postgres@127.0.0.1:5432/chorus_admission_bench \\
  REDIS_URL=redis://127.0.0.1:6379/12 .venv/bin/python bench/gc_per_request.py \\
    [--requests 1500] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gc
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

BODY = harness.ADMISSION_BODY
TENANTS = 100


def one_round(collector: str, kind: str, requests: int) -> dict[str, float]:
    """In this process: `requests` of `kind` with the collector as named."""
    from chorus.gc_tuning import tune_for_requests

    clients, urls = harness.in_process_tenants(TENANTS)
    if collector == "tuned":
        tune_for_requests()

    spent = [0.0]
    started = [0.0]
    counts = [0, 0, 0]

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            spent[0] += time.perf_counter() - started[0]
            counts[info["generation"]] += 1

    gc.callbacks.append(timed)
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
    gc.callbacks.remove(timed)
    return {
        "gc_ms": spent[0] * 1000 / requests,
        "cpu_ms": cpu * 1000 / requests,
        **{f"gen{g}": counts[g] * 1000 / requests for g in range(3)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", nargs=2, metavar=("COLLECTOR", "KIND"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_round(args.one[0], args.one[1], args.requests)))
        return

    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for _ in range(args.rounds):
        for kind in ("submit", "poll"):
            for collector in ("default", "tuned"):
                argv = [sys.executable, __file__, "--requests", str(args.requests)]
                done = subprocess.run(
                    [*argv, "--one", collector, kind],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                row = json.loads(done.stdout.strip().splitlines()[-1])
                results.setdefault((kind, collector), []).append(row)
                print(kind, collector, row, file=sys.stderr)

    print(
        f"\n{args.requests} requests a round, {args.rounds} rounds, medians; "
        "collections per 1,000 requests"
    )
    print("| request | collector | GC ms/request | gen 0 | gen 1 | gen 2 | CPU ms/request |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (kind, collector), rows in results.items():

        def median(name: str, rows: list[dict[str, float]] = rows) -> float:
            return statistics.median(row[name] for row in rows)

        print(
            f"| {kind} | {collector} | {median('gc_ms'):.3f} | {median('gen0'):.0f} "
            f"| {median('gen1'):.0f} | {median('gen2'):.1f} | {median('cpu_ms'):.2f} |"
        )


if __name__ == "__main__":
    main()
