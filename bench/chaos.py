"""Chaos: SIGKILL busy worker processes again and again, then count the damage.

Real worker processes (synthetic engine, one emulated GPU each, several jobs at
once) work through a batch of jobs while this script kills a worker that is
running jobs, `--kills` times, and starts it again as a supervisor would.
Afterwards it counts jobs lost (never finished), jobs succeeded more than once,
and jobs charged twice or charged without succeeding, from the job rows and the
quota ledger. A sweeper runs beside them, as in production.

  .venv/bin/python bench/chaos.py [--kills 100] [--jobs 150]

Prints a table and saves bench/out/chaos.png.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter

import harness

ENGINE = {"first_chunk_delay_s": 0.05, "rtf": 0.2, "chunk_s": 0.25, "seconds_per_char": 0.05}
TEXT = "Chaos does not lose jobs, and it never charges twice for one."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=150)
    parser.add_argument("--workers", type=int, default=3)
    args = parser.parse_args()
    harness.setup(broker_slots=1_000)
    from django.db.models import Count, Q, Sum

    from quotas.models import LedgerEntry, LedgerKind, UsagePeriod
    from synthesis.models import Job, JobStatus
    from synthesis.services.jobs import job_create
    from synthesis.speech_request import SpeechRequest

    tenant = harness.tenant("chaos")
    rng = random.Random(11)
    kill_times: list[float] = []
    sweeper = subprocess.Popen(
        [sys.executable, "manage.py", "sweeper", "--interval", "2"], cwd=harness.ROOT
    )
    try:
        with harness.workers(args.workers, ENGINE) as procs:
            ids = [
                job_create(tenant=tenant, api_key=None, speech=SpeechRequest(text=TEXT)).id
                for _ in range(args.jobs)
            ]
            start = time.monotonic()
            while len(kill_times) < args.kills and time.monotonic() - start < 300:
                time.sleep(rng.uniform(0.1, 0.3))
                running = Job.objects.filter(status=JobStatus.RUNNING).values_list(
                    "worker", flat=True
                )
                busy = {int(name.rsplit(":", 1)[1]) for name in running if ":" in name}
                targets = [n for n, proc in enumerate(procs) if proc.pid in busy]
                if not targets:
                    if not Job.objects.filter(
                        pk__in=ids, status__in=("queued", "running")
                    ).exists():
                        break  # nothing left to kill
                    continue
                n = rng.choice(targets)
                try:
                    os.kill(procs[n].pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue  # it exited since we looked: not a kill
                kill_times.append(time.monotonic() - start)
                procs[n].wait()
                harness.restart(procs, n)
            harness.wait_all(ids, timeout=600)
            elapsed = time.monotonic() - start
    finally:
        sweeper.terminate()

    jobs = Job.objects.filter(pk__in=ids)
    statuses = Counter(jobs.values_list("status", flat=True))
    lost = jobs.exclude(status__in=("succeeded", "failed", "cancelled")).count()
    ledger = (
        LedgerEntry.objects.filter(tenant=tenant)
        .values("job_id")
        .annotate(
            commits=Count("id", filter=Q(kind=LedgerKind.COMMIT)),
            refunds=Count("id", filter=Q(kind=LedgerKind.REFUND)),
        )
    )
    succeeded = set(jobs.filter(status="succeeded").values_list("pk", flat=True))
    double = sum(1 for r in ledger if r["commits"] + r["refunds"] > 1)
    wrong = sum(1 for r in ledger if (r["commits"] == 1) != (r["job_id"] in succeeded))
    period = UsagePeriod.objects.get(tenant=tenant)
    charged = jobs.filter(status="succeeded").aggregate(n=Sum("characters"))["n"] or 0
    attempts = Counter(jobs.values_list("attempts", flat=True))

    print(
        f"\n{args.jobs} jobs, {args.workers} workers, {len(kill_times)} SIGKILLs of busy "
        f"pool processes, {elapsed:.0f} s"
    )
    print(f"{'outcome':<44} {'count':>6}")
    for name, value in (
        ("succeeded", statuses.get("succeeded", 0)),
        ("failed with a reason (worker_lost)", statuses.get("failed", 0)),
        ("lost (never finished)", lost),
        ("settled twice (double-charged/refunded)", double),
        ("charged without succeeding, or not charged", wrong),
        ("characters used minus succeeded characters", period.characters_used - charged),
        ("characters still reserved", period.characters_reserved),
    ):
        print(f"{name:<44} {value:>6}")
    print("attempts per job: " + ", ".join(f"{k}: {v}" for k, v in sorted(attempts.items())))

    def draw(ax: object) -> None:
        keys = sorted(attempts)
        ax.bar(keys, [attempts[k] for k in keys], color="#417690")  # type: ignore[attr-defined]
        ax.set_xticks(keys)  # type: ignore[attr-defined]
        ax.set_xlabel("attempts a job needed")  # type: ignore[attr-defined]
        ax.set_ylabel("jobs")  # type: ignore[attr-defined]
        ax.set_title(f"{len(kill_times)} kills: {lost} lost, {double} double-settled")  # type: ignore[attr-defined]

    print(f"plot: {harness.save_plot('chaos.png', draw)}")


if __name__ == "__main__":
    main()
