"""Throughput across hosts: jobs/s with 1, 2 and 4 GPU hosts, each an emulated T4
at the published timing, on the namespaced cluster of `tests/cluster/` (HAProxy,
two web hosts, PgBouncer, Redis behind Sentinel, S3 on its own host).

For each size a fresh cluster is built, a line of jobs is submitted through the
load balancer (as many as the GPU hosts run in `--waves` waves at their normal
stream limit), and jobs/s is the count over the time from the first submit to
the last finish (the database's clock). Scaling is jobs/s against N x the
one-host figure. Then admission through the two web hosts: submits/s from a
pool of clients, and the machine's CPU per submit (on 2 cores the machine, not
the hosts, is the limit).

    sudo .venv/bin/python bench/cluster.py [--sizes 1,2,4] [--waves 4] [--rounds 1]

Needs root (network namespaces) and Debian's pgbouncer, haproxy, redis-sentinel.
Prints a table; writes bench/out/cluster.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chorus.settings")
os.environ.setdefault("CHORUS_DATA_DIR", str(Path(tempfile.gettempdir()) / "chorus-bench"))
OUT = ROOT / "bench" / "out"

# The t4-cosyvoice2 profile's own timing (first chunk 1.48 s alone, its curve).
PUBLISHED_T4: dict[str, object] = {}
TEXT = "Chorus keeps first audio flat under load, across as many machines as it needs."
NORMAL_STREAMS_PER_T4 = 5


def jobs_per_second(gpu_hosts: int, waves: int) -> dict[str, float]:
    from tests.cluster.stack import running_cluster
    from tests.cluster.workload import submit, wait_finished

    base = Path(tempfile.gettempdir()) / f"chorus-bench-cluster-{os.getpid()}"
    with running_cluster(base, gpu_hosts=gpu_hosts, timing=PUBLISHED_T4) as cluster:
        count = gpu_hosts * NORMAL_STREAMS_PER_T4 * waves
        with cluster.api() as api, ThreadPoolExecutor(8) as pool:
            ids = list(pool.map(lambda n: submit(api, f"{TEXT} ({n})"), range(count)))
            wait_finished(api, ids, timeout=60 + 30 * waves)
        first, last = cluster.query(
            "SELECT min(created_at), max(finished_at) FROM synthesis_job "
            "WHERE id = ANY(%s::uuid[])",
            (ids,),
        )[0]
        seconds = (last - first).total_seconds()
        admission = _admission(cluster) if gpu_hosts == 1 else {}
        return {"jobs": count, "seconds": seconds, "jobs_per_s": count / seconds, **admission}


def _admission(cluster) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Submits/s through HAProxy to web-1 and web-2, with the machine's CPU per submit."""
    total = 400
    cpu_before = psutil.cpu_times()
    started = time.monotonic()
    with ThreadPoolExecutor(16) as pool:

        def one(n: int) -> int:
            with cluster.api() as api:
                return api.post("/v1/speech", json={"text": f"Admission {n}."}).status_code

        statuses = list(pool.map(one, range(total)))
    elapsed = time.monotonic() - started
    cpu_after = psutil.cpu_times()
    busy = sum(getattr(cpu_after, f) - getattr(cpu_before, f) for f in ("user", "system"))
    return {
        "submits_per_s": statuses.count(202) / elapsed,
        "submit_failures": total - statuses.count(202),
        "cpu_ms_per_submit": 1000 * busy / total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,2,4")
    parser.add_argument("--waves", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    import django

    django.setup()
    sizes = [int(size) for size in args.sizes.split(",")]
    results: dict[int, list[dict[str, float]]] = {size: [] for size in sizes}
    for _ in range(args.rounds):
        for size in sizes:
            results[size].append(jobs_per_second(size, args.waves))
            print(f"{size} GPU host(s): {results[size][-1]}", file=sys.stderr)
    one = statistics.median(r["jobs_per_s"] for r in results[sizes[0]]) / sizes[0]
    print("\n| GPU hosts | jobs | jobs/s (median) | x one host | N x one | ratio |")
    print("| --- | --- | --- | --- | --- | --- |")
    for size in sizes:
        rate = statistics.median(r["jobs_per_s"] for r in results[size])
        print(
            f"| {size} | {results[size][0]['jobs']} | {rate:.2f} | {rate / one:.2f} | "
            f"{size} | {rate / (size * one):.2f} |"
        )
    admission = [r for r in results[sizes[0]] if "submits_per_s" in r]
    if admission:
        print("\n| admission through lb -> web-1, web-2 | value |")
        print("| --- | --- |")
        print(f"| submits/s | {statistics.median(r['submits_per_s'] for r in admission):.0f} |")
        print(f"| failed submits | {sum(r['submit_failures'] for r in admission)} |")
        print(
            f"| machine CPU per submit (all hosts) | "
            f"{statistics.median(r['cpu_ms_per_submit'] for r in admission):.1f} ms |"
        )
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "cluster.json").write_text(json.dumps({str(k): v for k, v in results.items()}, indent=1))


if __name__ == "__main__":
    main()
