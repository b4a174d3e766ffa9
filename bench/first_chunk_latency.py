"""Time to first audio byte of a streamed job, minus the engine's own first-chunk time.

The real stack: uvicorn serving the ASGI app, real Celery worker processes with
the synthetic engine, PostgreSQL and Redis. Each stream is `POST /v1/speech`
with `"stream": true, "format": "pcm"`; the client notes when the first body
byte arrives. The synthetic engine spends exactly `first_chunk_delay_s + rtf x
chunk_s` before its first chunk, so

  overhead = TTFB at the client - (first_chunk_delay_s + rtf x chunk_s)

is what Chorus adds: HTTP, auth, rate limit, job row + quota reservation,
publish, broker, worker claim, Redis stream, relay. One emulated GPU serializes
concurrent syntheses, so every worker gets its own emulated device
(`device=emuN`), up to `--max-workers`; beyond that, streams wait in the queue,
and the table shows that queue wait (job created -> started) separately, with
the overhead excluding it.

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


def main() -> None:
    global FIRST_COMPUTE_S
    FIRST_COMPUTE_S = engine_first_chunk_s()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="1,5,20,50")
    parser.add_argument("--samples", type=int, default=40, help="streams measured per level")
    parser.add_argument("--max-workers", type=int, default=10)
    parser.add_argument("--plot", default=str(ROOT / "bench" / "out" / "first_chunk_latency.png"))
    args = parser.parse_args()
    levels = [int(n) for n in args.levels.split(",")]

    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from synthesis.models import Job
    from synthesis.storage_runtime import get_storage
    from synthesis.worker import worker_argv
    from tenants.models import Plan, Tenant
    from tenants.services import api_key_create, tenant_create

    storage_root = tempfile.mkdtemp(prefix="chorus-bench-")
    os.environ.update(CHORUS_STORAGE="local", CHORUS_STORAGE_ROOT=storage_root)
    settings.STORAGE = {**settings.STORAGE, "local_root": storage_root}
    plan, _ = Plan.objects.update_or_create(
        name="bench-streaming",
        defaults={
            "monthly_characters": 10**12,
            "requests_per_minute": 10**6,
            "max_concurrent_jobs": 10**4,
        },
    )
    tenant = Tenant.objects.filter(slug="bench-stream").first() or tenant_create(
        slug="bench-stream", plan=plan
    )
    Tenant.objects.filter(pk=tenant.pk).update(plan=plan)
    get_storage().ensure_bucket(tenant.bucket)
    _, key = api_key_create(tenant=tenant, name="bench")

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
    }
    processes: list[subprocess.Popen[str]] = []
    rows: list[dict[str, Any]] = []
    try:
        processes.append(
            start_process(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "chorus.asgi:application",
                    "--port",
                    str(port),
                    "--log-level",
                    "info",
                    "--no-access-log",
                ],
                env,
                "Uvicorn running",
            )
        )
        for streams in levels:
            want = min(streams, args.max_workers)
            while len(processes) - 1 < want:  # one emulated GPU per worker
                n = len(processes) - 1
                options = {**ENGINE, "device": f"emu{n}", "state_dir": storage_root}
                processes.append(
                    start_process(
                        worker_argv(hostname=f"bench{n}@%h"),
                        {**env, "CHORUS_ENGINE_OPTIONS": json.dumps(options)},
                        " ready.",
                    )
                )
            rounds = max(1, args.samples // streams)
            results = asyncio.run(level(url, key, streams, rounds))
            jobs = {str(j.id): j for j in Job.objects.filter(id__in=[j for _, j, _ in results])}
            ttfb = [t for t, _, _ in results]
            waits = [
                (jobs[j].started_at - jobs[j].created_at).total_seconds() for _, j, _ in results
            ]
            # Where the rest goes: the worker until its first chunk, then stream + relay.
            worker = [
                (jobs[j].first_audio_at - jobs[j].started_at).total_seconds() - FIRST_COMPUTE_S
                for _, j, _ in results
            ]
            relayed = [w - jobs[j].first_audio_at.timestamp() for _, j, w in results]
            overhead = [t - FIRST_COMPUTE_S for t in ttfb]
            net = [o - w for o, w in zip(overhead, waits, strict=True)]
            rows.append(
                {
                    "streams": streams,
                    "workers": want,
                    "n": len(results),
                    "ttfb": ttfb,
                    "overhead": overhead,
                    "wait": waits,
                    "net": net,
                    "worker": worker,
                    "relay": relayed,
                }
            )
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
        f"{'p95':>7} {'queue p50':>9} {'p95':>7} {'excl. queue p50':>15} {'p95':>7}"
    )
    print(header)
    for row in rows:
        print(
            f"{row['streams']:>7} {row['workers']:>7} {row['n']:>4} "
            f"{statistics.median(row['ttfb']) * 1000:>9.1f} "
            f"{statistics.median(row['overhead']) * 1000:>12.1f} "
            f"{pct(row['overhead'], 0.95) * 1000:>7.1f} "
            f"{statistics.median(row['wait']) * 1000:>9.1f} {pct(row['wait'], 0.95) * 1000:>7.1f} "
            f"{statistics.median(row['net']) * 1000:>15.1f} {pct(row['net'], 0.95) * 1000:>7.1f}"
        )
    print("\nsplit (p50 / p95 ms): submit+queue = created->started, worker = started->first")
    print("audio minus engine time, relay = first audio row stamp -> first byte at the client")
    for row in rows:
        print(
            f"{row['streams']:>7} streams: "
            + "  ".join(
                f"{name} {statistics.median(row[name]) * 1000:.1f} / "
                f"{pct(row[name], 0.95) * 1000:.1f}"
                for name in ("wait", "worker", "relay")
            )
        )
    plot(rows, args.plot)
    print(f"plot: {args.plot}")


def plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    streams = [r["streams"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, label in (("overhead", "overhead"), ("net", "overhead excl. queue wait")):
        ax.plot(
            streams, [statistics.median(r[name]) * 1000 for r in rows], "o-", label=f"{label} p50"
        )
        ax.plot(streams, [pct(r[name], 0.95) * 1000 for r in rows], "s--", label=f"{label} p95")
    ax.axhline(25, color="grey", lw=0.8, ls=":", label="goal p50 (1 stream)")
    ax.axhline(60, color="grey", lw=0.8, ls="-.", label="goal p95 (1 stream)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(streams, [str(s) for s in streams])
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("ms")
    ax.set_title("Chorus streaming: time to first byte minus engine first-chunk time")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
