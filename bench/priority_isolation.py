"""Priority isolation: `high` jobs under a `low` backlog.

4 worker slots (4 worker processes, each its own emulated GPU) are saturated by
a backlog of 200 `low` jobs from tenant A; then tenant B submits `high` jobs one
by one. A `high` job should start as soon as any slot frees, so its queue wait is
bounded by the remaining time of the job ahead of it on that slot (at most one
job's duration; on average a quarter of it with 4 slots).

  .venv/bin/python bench/priority_isolation.py [--high 40]

Prints a table and saves bench/out/priority_isolation.png.
"""

from __future__ import annotations

import argparse
import time

import harness

ENGINE = {"first_chunk_delay_s": 0.1, "rtf": 0.5, "chunk_s": 0.5, "seconds_per_char": 0.05}
TEXT = "A bulk job of the low priority backlog."  # 39 chars: 1.95 s audio, ~1.1 s compute


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backlog", type=int, default=200)
    parser.add_argument("--high", type=int, default=40)
    parser.add_argument("--slots", type=int, default=4)
    args = parser.parse_args()
    harness.setup(broker_slots=2)
    from synthesis.models import Job
    from synthesis.services.jobs import job_create
    from synthesis.speech_request import SpeechRequest

    job_s = ENGINE["first_chunk_delay_s"] + ENGINE["rtf"] * len(TEXT) * ENGINE["seconds_per_char"]
    bulk, live = harness.tenant("bulk"), harness.tenant("live")
    with harness.workers(args.slots, ENGINE):
        for _ in range(args.backlog):
            job_create(tenant=bulk, api_key=None, speech=SpeechRequest(text=TEXT), priority="low")
        time.sleep(3 * job_s)  # every slot busy with low work
        high_ids = []
        for _ in range(args.high):
            high_ids.append(
                job_create(
                    tenant=live,
                    api_key=None,
                    speech=SpeechRequest(text="Live demo, now."),
                    priority="high",
                ).id
            )
            time.sleep(job_s / 2)
        harness.wait_all(high_ids, timeout=120)
        waits = [
            (job.started_at - job.created_at).total_seconds()
            for job in Job.objects.filter(pk__in=high_ids)
        ]
        low_waiting = Job.objects.filter(tenant=bulk, status__in=("pending", "queued")).count()

    p50, p95 = harness.percentile(waits, 0.5), harness.percentile(waits, 0.95)
    print(
        f"\n{args.slots} slots, {args.backlog} low jobs from A ({job_s:.2f} s each), "
        f"{args.high} high jobs from B; {low_waiting} low jobs still waiting at the end"
    )
    print(f"{'metric':<34} {'seconds':>8}")
    print(f"{'high queue wait p50':<34} {p50:8.3f}")
    print(f"{'high queue wait p95':<34} {p95:8.3f}")
    print(f"{'high queue wait max':<34} {max(waits):8.3f}")
    print(f"{'bound: one job ahead (duration)':<34} {job_s:8.3f}")
    print(f"{'expected mean with 4 slots (d/4)':<34} {job_s / args.slots:8.3f}")

    def draw(ax: object) -> None:
        ax.hist(waits, bins=20, color="#417690")  # type: ignore[attr-defined]
        ax.axvline(job_s, color="red", linestyle="--", label="bound: one job's duration")  # type: ignore[attr-defined]
        ax.set_xlabel("high job queue wait (s)")  # type: ignore[attr-defined]
        ax.set_ylabel("jobs")  # type: ignore[attr-defined]
        ax.set_title(f"high jobs behind {args.backlog} low jobs, {args.slots} slots")  # type: ignore[attr-defined]
        ax.legend()  # type: ignore[attr-defined]

    print(f"plot: {harness.save_plot('priority_isolation.png', draw)}")


if __name__ == "__main__":
    main()
