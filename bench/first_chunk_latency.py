"""Time to first audio byte of a streamed job, minus the engine's own first-chunk time.

The real stack: uvicorn serving the ASGI app, real Celery worker processes with
the synthetic engine, PostgreSQL and Redis. Each stream is `POST /v1/speech`
with `"stream": true, "format": "pcm"`; the client notes when the first body
byte arrives. The synthetic engine spends exactly `first_chunk_delay_s + rtf x
chunk_s` before its first chunk, so

  overhead = TTFB at the client - (first_chunk_delay_s + rtf x chunk_s)

is what Chorus adds: HTTP, auth, rate limit, job row + quota reservation,
publish, broker, worker claim, Redis stream, relay. Streams sharing an emulated
GPU slow each other (its profile's curve), which is not overhead: so every worker
runs one stream (`CHORUS_WORKER_STREAMS=1`) on its own emulated device
(`device=emuN`), up to `--max-workers`; beyond that, streams wait in the queue,
and the table shows that queue wait (job created -> started) separately, with
the overhead excluding it.

A second table holds `high` streams' overhead while `low` streams keep the
workers busy (0, 5, 20, 50 of them, each starting a new stream when its last
ends), with two worker set-ups: `shared` (every worker takes all three queues,
strict priority) and `lane` (the same plus one worker started with
`-Q synth.high`, the README's realtime lane). With shared workers a high
stream waits for a worker to finish its low job; the lane is there to keep it flat.

Usage (PostgreSQL and Redis as in `make test`):
  DATABASE_URL=postgres://postgres@127.0.0.1:5432/chorus_bench \\
  REDIS_URL=redis://127.0.0.1:6379/11 .venv/bin/python bench/first_chunk_latency.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chorus.settings")

import harness  # noqa: E402

from chorus.web_server import web_server_argv  # noqa: E402

ENGINE = {"first_chunk_delay_s": 0.2, "rtf": 0.02, "chunk_s": 0.25, "seconds_per_char": 0.06}
NOMINAL_FIRST_S = ENGINE["first_chunk_delay_s"] + ENGINE["rtf"] * ENGINE["chunk_s"]


def engine_first_chunk_s(runs: int = 20) -> float:
    """The engine's own first-chunk time, measured alone on this machine (median).

    The emulator spends its compute in 10 ms slices of a device lock, and sleeps
    overshoot, so it takes a few ms more than the nominal figure: that is the
    instrument's cost, not Chorus's, and is subtracted with the rest.
    """
    from synthesis.engines import load_engine

    engine = load_engine(
        "synthetic", {**ENGINE, "device": "calibration", "state_dir": tempfile.mkdtemp()}
    )
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        stream = engine.synthesize(text="Calibrating the engine alone.", voice=None)
        next(stream)
        times.append(time.perf_counter() - start)
        stream.close()
    engine.close()
    return statistics.median(times)


FIRST_COMPUTE_S = NOMINAL_FIRST_S  # replaced by the measured figure in main()
TEXT = "Chorus streams the first audio while the rest is still made."


OUTPUT: dict[int, list[str]] = {}  # each process's output, shown if a run fails


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def start_process(argv: list[str], env: dict[str, str], ready: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []

    def collect() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)

    threading.Thread(target=collect, daemon=True).start()
    OUTPUT[process.pid] = lines
    deadline = time.monotonic() + 120
    while not any(ready in line for line in lines):
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("did not start:\n" + "".join(lines[-40:]))
        time.sleep(0.1)
    return process


async def one_stream(http: httpx.AsyncClient, priority: str) -> tuple[float, str, float]:
    """(seconds to the first body byte, job id, wall time of that byte)"""
    started = time.perf_counter()
    first_wall = 0.0
    async with http.stream(
        "POST",
        "/v1/speech",
        json={"text": TEXT, "stream": True, "format": "pcm", "priority": priority},
    ) as response:
        if response.status_code != 200:
            raise SystemExit(f"{response.status_code}: {(await response.aread())!r}")
        first = 0.0
        async for _ in response.aiter_raw():
            if not first:
                first = time.perf_counter() - started
                first_wall = time.time()
        return first, response.headers["X-Job-Id"], first_wall


async def level(url: str, key: str, streams: int, rounds: int) -> list[tuple[float, str, float]]:
    results: list[tuple[float, str, float]] = []
    limits = httpx.Limits(max_connections=streams + 5, max_keepalive_connections=streams + 5)
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120, limits=limits
    ) as http:
        await one_stream(http, "normal")  # warm: connections, worker caches
        for _ in range(rounds):
            results += await asyncio.gather(*(one_stream(http, "normal") for _ in range(streams)))
    return results


async def mixed(
    url: str, key: str, lows: int, highs: int, low_done: list[int]
) -> list[tuple[float, str, float]]:
    """`highs` high streams one after another while `lows` low streams run."""
    import random

    rng = random.Random(lows)
    limits = httpx.Limits(max_connections=lows + 10, max_keepalive_connections=lows + 10)
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=300, limits=limits
    ) as http:
        await one_stream(http, "high")  # warm

        async def low_loop() -> None:
            while True:
                await one_stream(http, "low")
                low_done.append(1)

        background = [asyncio.create_task(low_loop()) for _ in range(lows)]
        await asyncio.sleep(1.0 if lows else 0)  # let the workers fill up
        results = []
        for _ in range(highs):
            results.append(await one_stream(http, "high"))
            await asyncio.sleep(rng.uniform(0.05, 0.3))  # land at any phase of a low job
        for task in background:
            task.cancel()  # the streams' jobs are cancelled as their clients leave
        await asyncio.gather(*background, return_exceptions=True)
    return results


def summarize(results: list[tuple[float, str, float]]) -> dict[str, list[float]]:
    from synthesis.models import Job

    jobs = {str(j.id): j for j in Job.objects.filter(id__in=[j for _, j, _ in results])}
    ttfb = [t for t, _, _ in results]
    waits = [(jobs[j].started_at - jobs[j].created_at).total_seconds() for _, j, _ in results]
    overhead = [t - FIRST_COMPUTE_S for t in ttfb]
    return {
        "ttfb": ttfb,
        "overhead": overhead,
        "wait": waits,
        "net": [o - w for o, w in zip(overhead, waits, strict=True)],
        # The worker until its first chunk is stamped, then what is left to the client.
        "worker": [
            (jobs[j].first_audio_at - jobs[j].started_at).total_seconds() - FIRST_COMPUTE_S
            for _, j, _ in results
        ],
        "relay": [w - jobs[j].first_audio_at.timestamp() for _, j, w in results],
    }


def wait_idle(tenant: Any, timeout: float = 120) -> None:
    """Until the tenant has nothing queued or running (cancelled streams drain)."""
    from synthesis.models import IN_FLIGHT, Job

    deadline = time.monotonic() + timeout
    while Job.objects.filter(tenant=tenant, status__in=IN_FLIGHT).exists():
        if time.monotonic() > deadline:
            raise SystemExit("jobs still in flight")
        time.sleep(0.2)


def main() -> None:
    global FIRST_COMPUTE_S
    FIRST_COMPUTE_S = engine_first_chunk_s()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="1,5,20,50")
    parser.add_argument("--samples", type=int, default=40, help="streams measured per level")
    parser.add_argument("--max-workers", type=int, default=10)
    parser.add_argument("--low-levels", default="0,5,20,50", help="'' to skip the mixed table")
    parser.add_argument("--high-samples", type=int, default=30)
    parser.add_argument("--shared-workers", type=int, default=3)
    parser.add_argument("--setups", default="shared,lane")
    parser.add_argument("--plot", default=str(ROOT / "bench" / "out" / "first_chunk_latency.png"))
    args = parser.parse_args()
    levels = [int(n) for n in args.levels.split(",") if n]
    low_levels = [int(n) for n in args.low_levels.split(",") if n]
    Path(args.plot).parent.mkdir(parents=True, exist_ok=True)

    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from synthesis.models import Job
    from synthesis.worker import worker_argv

    tenant, key = harness.http_tenant("bench-stream")
    state_dir = tempfile.mkdtemp(prefix="chorus-bench-gpu-")

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "CHORUS_ENGINE": "synthetic",
        "CHORUS_PUBLIC_URL": url,
        # One tenant makes every stream here: let them all into the broker at once.
        "CHORUS_TENANT_BROKER_SLOTS": "100000",
        # One stream per worker and device: the engine's first chunk stays its own.
        "CHORUS_WORKER_STREAMS": "1",
    }
    processes: list[subprocess.Popen[str]] = []
    rows: list[dict[str, Any]] = []
    mixed_rows: list[dict[str, Any]] = []
    try:
        processes.append(
            start_process(
                [*web_server_argv(host="127.0.0.1", port=port), "--log-level", "info"],
                env,
                "Uvicorn running",
            )
        )
        for streams in levels:
            want = min(streams, args.max_workers)
            while len(processes) - 1 < want:  # one emulated GPU per worker
                n = len(processes) - 1
                options = {**ENGINE, "device": f"emu{n}", "state_dir": state_dir}
                processes.append(
                    start_process(
                        worker_argv(hostname=f"bench{n}@%h"),
                        {**env, "CHORUS_ENGINE_OPTIONS": json.dumps(options)},
                        " ready.",
                    )
                )
            rounds = max(1, args.samples // streams)
            web = processes[0].pid
            web_before = harness.process_cpu_seconds(web)
            results = asyncio.run(level(url, key, streams, rounds))
            web_cpu = (harness.process_cpu_seconds(web) - web_before) / max(1, len(results))
            rows.append(
                {"streams": streams, "workers": want, "n": len(results), "web_cpu": web_cpu}
            )
            rows[-1].update(summarize(results))
            Job.objects.filter(tenant=tenant).delete()
        for setup in args.setups.split(",") if low_levels else ():
            for process in processes[1:]:  # a fresh set of workers per set-up
                process.terminate()
                process.wait()
            del processes[1:]
            lanes = [("synth.high",)] if setup == "lane" else []
            queues = [*lanes, *[tuple(settings.SYNTH_QUEUES)] * args.shared_workers]
            for n, lane in enumerate(queues):
                options = {**ENGINE, "device": f"mix{n}", "state_dir": state_dir}
                processes.append(
                    start_process(
                        worker_argv(queues=lane, hostname=f"mix{n}@%h"),
                        {**env, "CHORUS_ENGINE_OPTIONS": json.dumps(options)},
                        " ready.",
                    )
                )
            for lows in low_levels:
                low_done: list[int] = []
                started = time.monotonic()
                results = asyncio.run(mixed(url, key, lows, args.high_samples, low_done))
                mixed_rows.append(
                    {
                        "setup": setup,
                        "workers": f"{len(lanes)}+{args.shared_workers}",
                        "lows": lows,
                        "n": len(results),
                        "low_per_s": len(low_done) / (time.monotonic() - started),
                    }
                )
                mixed_rows[-1].update(summarize(results))
                wait_idle(tenant)
                Job.objects.filter(tenant=tenant).delete()
    except BaseException:
        for process in processes:
            print("".join(OUTPUT[process.pid][-30:]), file=sys.stderr)
        raise
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            process.wait()

    print(
        f"\nsynthetic engine {ENGINE}: first chunk costs the engine {FIRST_COMPUTE_S * 1000:.1f} ms"
        f" measured alone (nominal {NOMINAL_FIRST_S * 1000:.0f} ms)"
    )
    print(f"machine: {os.cpu_count()} CPUs; overhead = TTFB - engine first-chunk time (ms)")
    header = (
        f"{'streams':>7} {'workers':>7} {'n':>4} {'TTFB p50':>9} {'overhead p50':>12} "
        f"{'p95':>7} {'queue p50':>9} {'p95':>7} {'excl. queue p50':>15} {'p95':>7} "
        f"{'web CPU':>7}"
    )
    print(header)
    for row in rows:
        print(
            f"{row['streams']:>7} {row['workers']:>7} {row['n']:>4} "
            f"{statistics.median(row['ttfb']) * 1000:>9.1f} "
            f"{statistics.median(row['overhead']) * 1000:>12.1f} "
            f"{pct(row['overhead'], 0.95) * 1000:>7.1f} "
            f"{statistics.median(row['wait']) * 1000:>9.1f} {pct(row['wait'], 0.95) * 1000:>7.1f} "
            f"{statistics.median(row['net']) * 1000:>15.1f} {pct(row['net'], 0.95) * 1000:>7.1f} "
            f"{row['web_cpu'] * 1000:>7.2f}"
        )
    print("(web CPU: the web server's CPU time per stream, its submit and its relay)")
    print("\nsplit (p50 / p95 ms): queue = created->started (submit, publish, broker, claim),")
    print("worker = started->first audio stamped minus engine time (the chunk is sent to the")
    print("stream just before the stamp), relay = that stamp -> first byte at the client")
    for row in rows:
        print(
            f"{row['streams']:>7} streams: "
            + "  ".join(
                f"{name} {statistics.median(row[name]) * 1000:.1f} / "
                f"{pct(row[name], 0.95) * 1000:.1f}"
                for name in ("wait", "worker", "relay")
            )
        )
    if mixed_rows:
        print("\nhigh streams (one at a time) while low streams keep the workers busy (ms)")
        print(
            f"{'set-up':>6} {'workers':>7} {'low streams':>11} {'n':>4} {'overhead p50':>12} "
            f"{'p95':>7} {'queue p50':>9} {'p95':>7} {'excl. queue p50':>15} {'p95':>7} "
            f"{'low streams/s':>13}"
        )
        for row in mixed_rows:
            print(
                f"{row['setup']:>6} {row['workers']:>7} {row['lows']:>11} {row['n']:>4} "
                f"{statistics.median(row['overhead']) * 1000:>12.1f} "
                f"{pct(row['overhead'], 0.95) * 1000:>7.1f} "
                f"{statistics.median(row['wait']) * 1000:>9.1f} "
                f"{pct(row['wait'], 0.95) * 1000:>7.1f} "
                f"{statistics.median(row['net']) * 1000:>15.1f} "
                f"{pct(row['net'], 0.95) * 1000:>7.1f} {row['low_per_s']:>13.1f}"
            )
        print("\nsplit of the high streams (p50 / p95 ms), as above; before = the rest")
        print("(client -> job row: HTTP, auth, rate limit, quota)")
        for row in mixed_rows:
            before = [
                o - w - k - r
                for o, w, k, r in zip(
                    row["overhead"], row["wait"], row["worker"], row["relay"], strict=True
                )
            ]
            print(
                f"{row['setup']:>6} {row['lows']:>3} low: "
                + "  ".join(
                    f"{name} {statistics.median(values) * 1000:.1f} / "
                    f"{pct(values, 0.95) * 1000:.1f}"
                    for name, values in (
                        ("before", before),
                        ("queue", row["wait"]),
                        ("worker", row["worker"]),
                        ("relay", row["relay"]),
                    )
                )
            )
    plot(rows, mixed_rows, args.plot)
    print(f"plot: {args.plot}")


def plot(rows: list[dict[str, Any]], mixed_rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    streams = [r["streams"] for r in rows]
    for name, label in (("overhead", "overhead"), ("net", "overhead excl. queue wait")):
        left.plot(
            streams, [statistics.median(r[name]) * 1000 for r in rows], "o-", label=f"{label} p50"
        )
        left.plot(streams, [pct(r[name], 0.95) * 1000 for r in rows], "s--", label=f"{label} p95")
    left.axhline(25, color="grey", lw=0.8, ls=":", label="goal p50 (1 stream)")
    left.axhline(60, color="grey", lw=0.8, ls="-.", label="goal p95 (1 stream)")
    if streams:
        left.set_xscale("log")
        left.set_yscale("log")
        left.set_xticks(streams, [str(s) for s in streams])
    left.set_xlabel("concurrent streams")
    left.set_ylabel("ms")
    left.set_title("time to first byte minus engine first-chunk time")
    left.legend(fontsize=7)
    for setup, style, color in (("shared", "o", "C0"), ("lane", "s", "C2")):
        mine = [r for r in mixed_rows if r["setup"] == setup]
        if not mine:
            continue
        lows = [r["lows"] for r in mine]
        right.plot(
            lows,
            [statistics.median(r["overhead"]) * 1000 for r in mine],
            f"{style}-",
            color=color,
            label=f"{setup} ({mine[0]['workers']} workers) p50",
        )
        right.plot(
            lows,
            [pct(r["overhead"], 0.95) * 1000 for r in mine],
            f"{style}--",
            color=color,
            label=f"{setup} p95",
        )
    if mixed_rows:
        right.set_yscale("log")
    right.set_xlabel("concurrent low streams")
    right.set_ylabel("ms")
    right.set_title("high streams' overhead as low load grows")
    right.legend(fontsize=7)
    fig.suptitle("Chorus streaming overhead (synthetic engine)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
