"""What a worker spends on a job beyond the engine: its own milliseconds per job.

One real worker process (Celery, the synthetic engine with no emulated delay, so
the engine's share is only its signal generation, timed here in-process on the
same text) on PostgreSQL and Redis. Two runs:

  single    jobs one at a time, each submitted when the last finished
  backlog   one tenant submits all its jobs at once; with two broker slots each
            claim releases the tenant's next pending job (a refill and a publish)

For each it prints, per job: the worker process's CPU ms (utime + stime from
/proc; CPU time, little disturbed by other work on the machine), and its wall ms
from claim to finish minus the engine's time (p50, p95); for the backlog also its
span, from the first job's start to the last one's end, and the longest wait
between one job's end and the next one's start (a stalled consumer shows there).

  DATABASE_URL=postgres://postgres@127.0.0.1:5432/chorus_bench \\
  REDIS_URL=redis://127.0.0.1:6379/11 .venv/bin/python bench/worker_overhead.py --jobs 100
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from admission import cpu_seconds, web_pids

ENGINE = {"first_chunk_delay_s": 0.0, "rtf": 0.0}
TEXT = "Chorus measures what a worker adds to every job, in milliseconds."


def engine_ms() -> float:
    """The engine's own time for TEXT, as the worker runs it (median of 20)."""
    import tempfile

    from synthesis.engines import load_engine

    engine = load_engine("synthetic", {**ENGINE, "state_dir": tempfile.mkdtemp()})
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        for _chunk in engine.synthesize(text=TEXT, voice=None):
            pass
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def run(tenant: Any, jobs: int, *, backlog: bool, worker_pid: int) -> dict[str, Any]:
    from synthesis.models import Job, JobStatus
    from synthesis.services.jobs import job_create
    from synthesis.speech_request import SpeechRequest

    Job.objects.filter(tenant=tenant).delete()
    pids = web_pids(worker_pid)
    cpu0 = sum(cpu_seconds(p) for p in pids)
    ids = []
    if backlog:
        ids = [
            job_create(tenant=tenant, api_key=None, speech=SpeechRequest(text=TEXT)).id
            for _ in range(jobs)
        ]
        harness.wait_all(ids, timeout=600)
    else:
        for _ in range(jobs):
            job = job_create(tenant=tenant, api_key=None, speech=SpeechRequest(text=TEXT))
            harness.wait_all([job.id], timeout=60)
            ids.append(job.id)
    cpu = sum(cpu_seconds(p) for p in web_pids(worker_pid)) - cpu0
    done = list(Job.objects.filter(pk__in=ids))
    assert all(j.status == JobStatus.SUCCEEDED for j in done), {j.status for j in done}
    done.sort(key=lambda job: job.started_at)
    # From the latest end so far to the next start: jobs may overlap.
    ended = list(itertools.accumulate((j.finished_at for j in done), max))
    waits = [
        (later.started_at - end).total_seconds()
        for end, later in zip(ended, done[1:], strict=False)
    ]
    return {
        "cpu_ms": cpu * 1000 / jobs,
        "wall_ms": [(j.finished_at - j.started_at).total_seconds() * 1000 for j in done],
        "span_s": (max(j.finished_at for j in done) - done[0].started_at).total_seconds(),
        "longest_wait_ms": max(waits, default=0.0) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=100)
    args = parser.parse_args()

    harness.setup(broker_slots=2)
    from synthesis.storage_runtime import get_storage

    tenant = harness.tenant("worker-overhead")
    get_storage().ensure_bucket(tenant.bucket)
    engine = engine_ms()
    rows = []
    with harness.workers(1, ENGINE) as procs:
        run(tenant, 10, backlog=False, worker_pid=procs[0].pid)  # warm: connections, caches
        for name, backlog in (("single", False), ("backlog", True)):
            result = run(tenant, args.jobs, backlog=backlog, worker_pid=procs[0].pid)
            own = [w - engine for w in result["wall_ms"]]
            rows.append((name, result, statistics.median(own), own))
            print(name, f"{result['cpu_ms']:.1f}", f"{statistics.median(own):.1f}", file=sys.stderr)
    print(f"\n{args.jobs} jobs per run, one worker, synthetic engine {ENGINE}")
    print(f"engine's own time per job (in-process, median): {engine:.1f} ms")
    print(
        "| run | worker CPU ms/job | claim→finish minus engine, p50 ms | p95 ms "
        "| span s | longest wait between jobs ms |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for name, result, p50, own in rows:
        span = (
            f"{result['span_s']:.2f} | {result['longest_wait_ms']:.0f}"
            if name == "backlog"
            else "- | -"
        )
        print(
            f"| {name} | {result['cpu_ms']:.1f} | {p50:.1f} "
            f"| {harness.percentile(own, 0.95):.1f} | {span} |"
        )


if __name__ == "__main__":
    main()
