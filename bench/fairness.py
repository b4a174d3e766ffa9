"""Fairness: tenant B's 10 `low` jobs behind tenant A's 1,000.

Runs the same scenario twice on 4 worker slots: with fair admission (each tenant
keeps 2 jobs per priority in the broker, the rest pending) and without it (every
job straight into the broker: plain FIFO). Reports when B's jobs complete.

  .venv/bin/python bench/fairness.py [--backlog 1000]

Prints a table and saves bench/out/fairness.png.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import harness

ENGINE = {"first_chunk_delay_s": 0.02, "rtf": 0.05, "chunk_s": 0.5, "seconds_per_char": 0.05}
TEXT = "Bulk narration."  # 15 chars: 0.75 s of audio, about 0.06 s of compute


def run(slots: int, backlog: int, workers: int) -> list[float]:
    """One scenario in a fresh process (settings are read once per process)."""
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            str(slots),
            "--backlog",
            str(backlog),
            "--workers",
            str(workers),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parent,
    )
    return [float(x) for x in out.stdout.strip().splitlines()[-1].split(",")]


def child(slots: int, backlog: int, workers: int) -> None:
    harness.setup(broker_slots=slots)
    from django.utils import timezone

    from synthesis.models import Job
    from synthesis.services.jobs import job_create
    from synthesis.speech_request import SpeechRequest

    a, b = harness.tenant("a"), harness.tenant("b")
    # The whole backlog is in line before any worker starts, so B's jobs really
    # stand behind all of A's (with fair admission, only 2 of A's are in the broker).
    for _ in range(backlog):
        job_create(tenant=a, api_key=None, speech=SpeechRequest(text=TEXT), priority="low")
    b_ids = [
        job_create(tenant=b, api_key=None, speech=SpeechRequest(text=TEXT), priority="low").id
        for _ in range(10)
    ]
    with harness.workers(workers, ENGINE):
        ready = timezone.now()
        harness.wait_all(b_ids, timeout=900)
        done = [
            (finished - ready).total_seconds()
            for finished in Job.objects.filter(pk__in=b_ids).values_list("finished_at", flat=True)
        ]
        a_left = Job.objects.filter(tenant=a, status__in=("pending", "queued")).count()
    print(f"A jobs still waiting when B's last finished: {a_left}", file=sys.stderr)
    print(",".join(f"{x:.3f}" for x in sorted(done)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backlog", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.backlog, args.workers)
        return
    fair = run(2, args.backlog, args.workers)
    fifo = run(1_000_000, args.backlog, args.workers)
    print(
        f"\nB's 10 low jobs queued after A's {args.backlog}, then {args.workers} workers "
        "started; seconds from then until each of B's jobs finished"
    )
    print(f"{'admission':<22} {'B first done s':>15} {'B p50 s':>9} {'B last done s':>14}")
    for name, times in (("fair (2 slots/tenant)", fair), ("FIFO (no admission)", fifo)):
        print(
            f"{name:<22} {times[0]:15.2f} {harness.percentile(times, 0.5):9.2f} {times[-1]:14.2f}"
        )

    def draw(ax: object) -> None:
        ax.plot(range(1, 11), fair, "o-", label="fair admission")  # type: ignore[attr-defined]
        ax.plot(range(1, 11), fifo, "s-", label="FIFO")  # type: ignore[attr-defined]
        ax.set_xlabel("B's jobs, in order of completion")  # type: ignore[attr-defined]
        ax.set_ylabel("seconds after the workers started")  # type: ignore[attr-defined]
        ax.set_yscale("log")  # type: ignore[attr-defined]
        ax.set_title(f"B's 10 jobs behind A's {args.backlog}")  # type: ignore[attr-defined]
        ax.legend()  # type: ignore[attr-defined]

    print(f"plot: {harness.save_plot('fairness.png', draw)}")


if __name__ == "__main__":
    main()
