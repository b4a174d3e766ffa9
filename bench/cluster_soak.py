"""Two sweepers under load for ten minutes, on the namespaced cluster of
`tests/cluster/`: no repair done twice, none missed.

Tenants submit a steady line through the load balancer (plain jobs, and a
streamed one in every few) while GPU hosts die in turn: every `--kill-every`
seconds one GPU host's processes are SIGKILLed and its link is cut, and it comes
back (a replaced machine) 25 s later, after the sweepers have seen its heartbeat
go silent. Both sweepers run the whole time, each every 2 s.

At the end, every job must have finished; the jobs put back on the line (the
attempts past the first, counted in the database) must equal the requeues the
two sweepers' `chorus_sweeper_actions_total{action="requeued"}` counters report
(a repair done twice would count more, one missed would leave a job running or
count less); and no job may be charged other than its end says.

    sudo .venv/bin/python bench/cluster_soak.py [--minutes 10] [--kill-every 60] [--rate 1.5]

Needs root (network namespaces) and Debian's pgbouncer, haproxy, redis-sentinel.
Prints a table; writes bench/out/cluster_soak.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chorus.settings")
os.environ.setdefault("CHORUS_DATA_DIR", str(Path(tempfile.gettempdir()) / "chorus-bench"))
OUT = ROOT / "bench" / "out"

# About 16 s of audio, 3 s of work on a sped-up emulated T4: a few jobs are
# running on a host whenever it dies.
SENTENCE = "Two sweepers, one repair each: the line keeps moving as machines come and go."
TEXT = " ".join([SENTENCE] * 4)
DOWN_S = 25.0  # heartbeat silent for 10 s, then a sweeper pass: requeued well before this
STREAM_EVERY = 5  # one submit in this many is streamed


def soak(minutes: float, kill_every: float, rate: float) -> dict[str, Any]:
    from tests.cluster.stack import METRICS_PORT, running_cluster
    from tests.cluster.workload import (
        metric_sum,
        stream_one,
        submit,
        wait_finished,
        wrongly_charged,
    )

    base = Path(tempfile.gettempdir()) / f"chorus-bench-soak-{os.getpid()}"
    with running_cluster(base, gpu_hosts=2) as cluster:
        network = cluster.network
        assert network is not None
        ids: list[str] = []
        streams: list[Future[Any]] = []
        kills: list[str] = []
        stop = threading.Event()

        def kill_in_turn() -> None:
            turn = 0
            while not stop.wait(kill_every - DOWN_S):
                host = cluster.gpu_names[turn % len(cluster.gpu_names)]
                turn += 1
                network.kill_processes(host)
                network.cut(host)
                kills.append(host)
                print(f"{time.strftime('%X')} {host} lost", file=sys.stderr)
                time.sleep(DOWN_S)
                network.plug(host)
                time.sleep(0.5)
                cluster.start_gpu_worker(host)

        started = time.monotonic()
        deadline = started + 60 * minutes
        killer = threading.Thread(target=kill_in_turn, daemon=True)
        killer.start()
        with cluster.api() as api, ThreadPoolExecutor(12) as pool:
            n = 0
            while time.monotonic() < deadline:
                text = f"{TEXT} ({n})"
                if n % STREAM_EVERY == 0:
                    streams.append(pool.submit(stream_one, cluster, text, timeout=300))
                else:
                    ids.append(submit(api, text))
                n += 1
                time.sleep(max(0.0, started + n / rate - time.monotonic()))
            stop.set()
            outcomes = [future.result() for future in streams]
            killer.join()
            ids += [outcome.job_id for outcome in outcomes if outcome.job_id]
            jobs = wait_finished(api, ids, timeout=300)
        # A long text's work is its segments' (its own row is never claimed).
        moved, attempts_max = cluster.query(
            "SELECT coalesce(sum(attempts - 1), 0), coalesce(max(attempts), 0) "
            "FROM synthesis_job WHERE (id = ANY(%s::uuid[]) OR parent_id = ANY(%s::uuid[])) "
            "AND attempts > 0",
            (ids, ids),
        )[0]
        actions = {}
        for sweeper in ("sweeper-1", "sweeper-2"):
            scrape = cluster.scrape(sweeper, METRICS_PORT)
            actions[sweeper] = metric_sum(scrape, "chorus_sweeper_actions_total", action="requeued")
        statuses = [job["status"] for job in jobs.values()]
        return {
            "minutes": minutes,
            "jobs": len(ids),
            "streamed": len(outcomes),
            "stream_failures": sum(1 for o in outcomes if o.status != 200),
            "stream_failure_kinds": dict(
                Counter(f"{o.status} {o.error[:120]}" for o in outcomes if o.status != 200)
            ),
            "succeeded": statuses.count("succeeded"),
            "failed": statuses.count("failed"),
            "hosts_lost": len(kills),
            "moved": int(moved),
            "attempts_max": int(attempts_max),
            "requeued_by": actions,
            "wrongly_charged": len(wrongly_charged(cluster)),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--kill-every", type=float, default=60)
    parser.add_argument("--rate", type=float, default=1.5, help="submits per second")
    args = parser.parse_args()
    import django

    django.setup()
    result = soak(args.minutes, args.kill_every, args.rate)
    requeued = sum(result["requeued_by"].values())
    print("\n| two sweepers under load | value |")
    print("| --- | --- |")
    print(f"| minutes | {result['minutes']:g} |")
    print(f"| jobs (streamed) | {result['jobs']} ({result['streamed']}) |")
    print(f"| succeeded / failed | {result['succeeded']} / {result['failed']} |")
    print(f"| streams not answered 200 | {result['stream_failures']} |")
    print(f"| GPU hosts lost | {result['hosts_lost']} |")
    print(f"| jobs put back (attempts past the first) | {result['moved']} |")
    by = ", ".join(f"{name} {count:g}" for name, count in result["requeued_by"].items())
    print(f"| requeues the sweepers counted | {requeued:g} ({by}) |")
    print(f"| repairs done twice or missed | {requeued - result['moved']:+g} |")
    print(f"| jobs charged wrong | {result['wrongly_charged']} |")
    for kind, count in result["stream_failure_kinds"].items():
        print(f"stream not answered 200 ({count}x): {kind}", file=sys.stderr)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "cluster_soak.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
