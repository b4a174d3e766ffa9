"""The published one-card load test, run through Chorus on ONE emulated T4.

Method of the published measurement (CosyVoice2-0.5B on a T4): 1 to 5
simultaneous users, 10 requests per level, streaming, a 5 s reference voice, a
short sentence; first audio and total time per request. Here every request is
`POST /v1/speech` with `"stream": true` through uvicorn (each of the 1-5 users a
tenant of its own, as separate people are; one tenant for all in the other
tables, the harder case for fair admission and ordering), a real
Celery worker with the synthetic engine on the `t4-cosyvoice2` profile (the
curve and memory of that card, `synthesis/engines/device_profiles.py`), real
PostgreSQL and Redis. The sentence is sized to the profile's 4 s of audio, so
one stream alone takes the published 1.48 s / 3.20 s.

Tables:
1. 1-5 users beside the published figures, throughput against one user, peak
   emulated memory; then what Chorus adds to the card's own first audio, and the
   web server's CPU per streamed job (its submit and its relay);
2. 10, 20 and 50 users on the same card (one request each, all at once):
   failures, first audio, total, order within the tenant, server CPU per job;
3. `high` first audio (one request at a time) while 0, 20 and 50 `low` users
   keep the card busy;
4. throughput on 1, 2 and 4 cards, each kept full (8 users per card, 30 s,
   counting jobs finished after the first 8 s).

Usage (PostgreSQL and Redis as in `make test`; about 12 minutes):
  DATABASE_URL=postgres://postgres@127.0.0.1:5432/chorus_bench \\
  REDIS_URL=redis://127.0.0.1:6379/11 .venv/bin/python bench/one_gpu.py
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import math
import os
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import soundfile as sf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chorus.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/chorus_bench")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/11")

from first_chunk_latency import OUTPUT, start_process  # noqa: E402
from harness import ensure_database, http_tenant, process_cpu_seconds  # noqa: E402

from chorus.web_server import web_server_argv  # noqa: E402

PUBLISHED_FIRST = (1.48, 1.52, 1.61, 1.79, 2.13)
PUBLISHED_TOTAL = (3.20, 3.45, 3.72, 4.18, 4.96)
PUBLISHED_MEMORY_GB = (6.2, 7.1, 8.3, 10.5, 12.8)
TEXT = "Chorus keeps first audio flat while many people speak with one card."
# The profile's 4.0 s of audio for this sentence (the synthetic engine's length rule).
ENGINE = {"seconds_per_char": 4.0 / len(TEXT)}


@dataclass
class Request:
    first: float
    total: float
    job_id: str
    error: str = ""


@dataclass
class Account:
    """A tenant's key and its 5 s reference voice."""

    key: str
    voice_id: str = ""


@dataclass
class Stack:
    url: str
    state_dir: str
    # The first is the tenant of the one-tenant tables; the 1-5 users table gives
    # each user a tenant of its own, like the published test's separate people.
    accounts: list[Account] = field(default_factory=list)
    processes: list[Any] = field(default_factory=list)
    workers: list[Any] = field(default_factory=list)


async def one_request(http: httpx.AsyncClient, priority: str) -> Request:
    started = time.perf_counter()
    first = 0.0
    body = {"text": TEXT, "stream": True, "format": "pcm", "priority": priority}
    body["voice_id"] = str(http.headers["X-Bench-Voice"])
    try:
        async with http.stream("POST", "/v1/speech", json=body) as response:
            if response.status_code != 200:
                error = (await response.aread()).decode()[:200]
                return Request(0, 0, "", f"{response.status_code} {error}")
            async for _ in response.aiter_raw():
                first = first or time.perf_counter() - started
            job_id = response.headers["X-Job-Id"]
    except httpx.HTTPError as exc:
        return Request(0, 0, "", type(exc).__name__)
    return Request(first, time.perf_counter() - started, job_id)


def client(stack: Stack, connections: int, account: int = 0) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections + 5, max_keepalive_connections=connections)
    chosen = stack.accounts[account]
    return httpx.AsyncClient(
        base_url=stack.url,
        # The voice rides along in a header only the bench reads (the server ignores it).
        headers={"Authorization": f"Bearer {chosen.key}", "X-Bench-Voice": chosen.voice_id},
        timeout=600,
        limits=limits,
    )


async def simultaneous(
    stack: Stack, users: int, rounds: int, *, separate: bool = False
) -> tuple[list[Request], float]:
    """`rounds` times, `users` requests started together (each user its own tenant
    when `separate`, else all one tenant's); (requests, wall seconds)."""
    results: list[Request] = []
    clients = [client(stack, users, n if separate else 0) for n in range(users)]
    try:
        began = time.perf_counter()
        for _ in range(rounds):
            results += await asyncio.gather(*(one_request(http, "normal") for http in clients))
        return results, time.perf_counter() - began
    finally:
        for http in clients:
            await http.aclose()


async def high_under_low(stack: Stack, lows: int, samples: int) -> list[Request]:
    """`samples` high requests, one after another, while `lows` low users loop."""
    async with client(stack, lows + 2) as http:

        async def low_user() -> None:
            while True:
                await one_request(http, "low")

        background = [asyncio.create_task(low_user()) for _ in range(lows)]
        await asyncio.sleep(3.0 if lows else 0)  # the card fills with low streams
        results = []
        for n in range(samples):
            results.append(await one_request(http, "high"))
            await asyncio.sleep(0.1 + 0.37 * (n % 5))  # land at any phase of the low jobs
        for task in background:
            task.cancel()  # their jobs are cancelled as the clients leave
        await asyncio.gather(*background, return_exceptions=True)
    return results


async def saturate(stack: Stack, users: int, seconds: float, warmup: float = 8.0) -> float:
    """Requests per second completed by `users` looping users, counted after
    `warmup` seconds (the card has filled) until `seconds`."""
    finished: list[float] = []
    began = time.perf_counter()
    deadline = began + seconds
    async with client(stack, users) as http:

        async def user() -> None:
            while time.perf_counter() < deadline:
                if not (await one_request(http, "normal")).error:
                    finished.append(time.perf_counter() - began)

        await asyncio.gather(*(user() for _ in range(users)))
    counted = [t for t in finished if warmup <= t <= seconds]
    return len(counted) / (seconds - warmup)


class MemoryWatch:
    """Peak emulated GPU memory of every device, sampled from the ledgers."""

    def __init__(self, state_dir: str) -> None:
        self.state_dir = Path(state_dir)
        self.peak = 0
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> None:
        for ledger in self.state_dir.glob("*.ledger.json"):
            try:
                entries = json.loads(ledger.read_text())["reservations"].values()
            except (OSError, ValueError, KeyError):
                continue
            self.peak = max(self.peak, sum(int(e["bytes"]) for e in entries))

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(0.05)


async def watched(stack: Stack, coro: Any) -> tuple[Any, int]:
    watch = MemoryWatch(stack.state_dir)
    task = asyncio.create_task(watch.run())
    try:
        return await coro, watch.peak
    finally:
        task.cancel()


def cpu_seconds(stack: Stack, *, web_only: bool = False) -> float:
    """CPU time of the server's processes (web and workers; or the web
    server's alone) so far."""
    processes = stack.processes[:1] if web_only else stack.processes
    return sum(process_cpu_seconds(process.pid) for process in processes)


def order_inversions(job_ids: list[str]) -> tuple[int, float]:
    """Jobs that started before an older job of the same tenant and priority:
    (how many, by how much at most, seconds)."""
    from synthesis.models import Job

    jobs = list(Job.objects.filter(pk__in=[j for j in job_ids if j]).order_by("created_at", "id"))
    count, worst = 0, 0.0
    latest = None
    for job in jobs:
        if job.started_at is None:
            continue
        if latest is not None and job.started_at < latest:
            count += 1
            worst = max(worst, (latest - job.started_at).total_seconds())
        latest = job.started_at if latest is None else max(latest, job.started_at)
    return count, worst


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else math.nan


def gb(nbytes: int) -> float:
    return nbytes / 1e9


# --- the stack ------------------------------------------------------------------


def start_stack(cards: int) -> Stack:
    ensure_database()
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from chorus.redis_client import get_redis
    from synthesis.models import Job, Voice, WorkerHeartbeat

    redis = get_redis()
    assert redis is not None
    redis.delete(*settings.SYNTH_QUEUES, "unacked", "unacked_index")
    Job.objects.all().delete()
    WorkerHeartbeat.objects.all().delete()
    Voice.objects.filter(tenant__slug__startswith="bench-one-gpu").delete()  # earlier runs
    keys = [http_tenant(f"bench-one-gpu-{n}")[1] for n in range(5)]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    stack = Stack(url=f"http://127.0.0.1:{port}", state_dir=tempfile.mkdtemp())
    env = {**os.environ, "CHORUS_ENGINE": "synthetic", "CHORUS_PUBLIC_URL": stack.url}
    argv = web_server_argv(host="127.0.0.1", port=port)
    stack.processes.append(start_process(argv, env, "Uvicorn running"))
    try:
        add_cards(stack, cards, env)
        stack.accounts = [Account(key, upload_voice(stack.url, key)) for key in keys]
    except BaseException:
        stop_stack(stack)  # a worker left behind would take the next run's jobs
        raise
    return stack


def add_cards(stack: Stack, cards: int, env: dict[str, str] | None = None) -> None:
    from synthesis.worker import worker_argv

    env = env or {**os.environ, "CHORUS_ENGINE": "synthetic", "CHORUS_PUBLIC_URL": stack.url}
    while len(stack.workers) < cards:
        n = len(stack.workers)
        options = {**ENGINE, "device": f"t4-{n}", "state_dir": stack.state_dir}
        worker = start_process(
            worker_argv(hostname=f"card{n}@%h"),
            {**env, "CHORUS_ENGINE_OPTIONS": json.dumps(options)},
            " ready.",
        )
        stack.workers.append(worker)
        stack.processes.append(worker)
    time.sleep(1.0)  # each consumer connects to the broker


def upload_voice(url: str, key: str) -> str:
    """A 5 s reference voice, as in the published test."""
    rate = 24000
    t = np.arange(5 * rate) / rate
    samples = 0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.3 * np.sin(2 * np.pi * 3 * t))
    buffer = io.BytesIO()
    sf.write(buffer, samples.astype(np.float32), rate, format="WAV")
    response = httpx.post(
        f"{url}/v1/voices",
        headers={"Authorization": f"Bearer {key}"},
        data={"name": "reference", "transcript": "A five second reference."},
        files={"audio": ("reference.wav", buffer.getvalue(), "audio/wav")},
        timeout=60,
    )
    response.raise_for_status()
    return str(response.json()["id"])


def stop_stack(stack: Stack) -> None:
    for process in stack.processes:
        process.terminate()
    for process in stack.processes:
        try:
            process.wait(timeout=30)
        except Exception:
            process.kill()


# --- the tables -------------------------------------------------------------------


def device_alone(requests: int) -> list[tuple[float, float]]:
    """The emulated card's own first audio and total (means) at 1-5 streams, with
    nothing of Chorus around it: the engine in this process, each stream a thread
    started with the others, on a card of its own; what Chorus adds is measured
    against this, not against the published figures the emulator is calibrated
    to (it runs a little over them: its 10 ms slices, a host's late wake-ups)."""
    from synthesis.calibration.measure import reference_voice, streams_together
    from synthesis.engines import load_engine

    engine = load_engine(
        "synthetic", {**ENGINE, "device": "alone", "state_dir": tempfile.mkdtemp()}
    )
    voice = reference_voice(engine)
    levels = []
    for users in range(1, 6):
        # Started at one instant, as a worker's own calibration runs them.
        runs = [
            run
            for _ in range(max(1, math.ceil(requests / users)))
            for run in streams_together(engine, TEXT, voice, users)[0]
        ]
        levels.append(
            (statistics.mean(run[0] for run in runs), statistics.mean(run[1] for run in runs))
        )
    engine.close()
    return levels


def published_table(stack: Stack, requests: int) -> list[dict[str, Any]]:
    alone = device_alone(requests)
    rows = []
    for users in range(1, 6):
        rounds = max(1, math.ceil(requests / users))
        web_before = cpu_seconds(stack, web_only=True)
        (results, wall), peak = asyncio.run(
            watched(stack, simultaneous(stack, users, rounds, separate=True))
        )
        web_cpu = cpu_seconds(stack, web_only=True) - web_before
        ok = [r for r in results if not r.error]
        rows.append(
            {
                "users": users,
                "failed": len(results) - len(ok),
                "first": statistics.mean(r.first for r in ok),
                "total": statistics.mean(r.total for r in ok),
                "first_sd": statistics.pstdev(r.first for r in ok),
                "throughput": len(ok) / wall,
                "memory": gb(peak),
                "web_cpu": web_cpu / max(1, len(results)),
            }
        )
    base = rows[0]["throughput"]
    print("\n## 1-5 users on one emulated T4 (mean of", requests, "requests per level)\n")
    print(
        "| users | first audio s (published) | diff | total s (published) | diff "
        "| throughput vs 1 user | peak memory GB (published) | failed |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for row, pf, pt, pm in zip(
        rows, PUBLISHED_FIRST, PUBLISHED_TOTAL, PUBLISHED_MEMORY_GB, strict=True
    ):
        first_diff = 100 * (row["first"] / pf - 1)
        total_diff = 100 * (row["total"] / pt - 1)
        print(
            f"| {row['users']} | {row['first']:.2f} ({pf:.2f}) | {first_diff:+.1f} % "
            f"| {row['total']:.2f} ({pt:.2f}) | {total_diff:+.1f} % "
            f"| {row['throughput'] / base:.2f}x | {row['memory']:.1f} ({pm:.1f}) "
            f"| {row['failed']} |"
        )
    print("\nWhat Chorus adds to the emulated card's own first audio (the card alone:")
    print("the engine in one process, the same streams at once, no HTTP, queue or relay)\n")
    print(
        "| users | first audio s through Chorus | the card alone | Chorus adds | web CPU ms/job |"
    )
    print("| --- | --- | --- | --- | --- |")
    for row, (first_alone, _) in zip(rows, alone, strict=True):
        added = row["first"] - first_alone
        print(
            f"| {row['users']} | {row['first']:.3f} | {first_alone:.3f} "
            f"| {added * 1000:+.0f} ms ({100 * added / first_alone:+.1f} %) "
            f"| {1000 * row['web_cpu']:.1f} |"
        )
    return rows


def crowd_table(stack: Stack, levels: list[int], one_user_first: float) -> list[dict[str, Any]]:
    rows = []
    for users in levels:
        cpu_before = cpu_seconds(stack)
        (results, wall), peak = asyncio.run(watched(stack, simultaneous(stack, users, 1)))
        cpu = cpu_seconds(stack) - cpu_before
        ok = [r for r in results if not r.error]
        inversions, worst = order_inversions([r.job_id for r in ok])
        rows.append(
            {
                "users": users,
                "failed": len(results) - len(ok),
                "errors": sorted({r.error for r in results if r.error})[:3],
                "first_p50": pct([r.first for r in ok], 0.5),
                "first_p95": pct([r.first for r in ok], 0.95),
                "total_p95": pct([r.total for r in ok], 0.95),
                "throughput": len(ok) / wall,
                "memory": gb(peak),
                "inversions": inversions,
                "worst": worst,
                "cpu_per_job": cpu / max(1, len(ok)),
            }
        )
    print("\n## Many users on the same card (one request each, all at once)\n")
    print(
        "| users | failed | first audio p50 / p95 s | total p95 s | jobs/s "
        "| peak memory GB | started before an older job | server CPU s/job |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(
            f"| {row['users']} | {row['failed']} {' '.join(row['errors'])} "
            f"| {row['first_p50']:.2f} / {row['first_p95']:.2f} | {row['total_p95']:.2f} "
            f"| {row['throughput']:.2f} | {row['memory']:.1f} "
            f"| {row['inversions']} (max {1000 * row['worst']:.0f} ms) | {row['cpu_per_job']:.3f} |"
        )
    return rows


def high_table(stack: Stack, low_levels: list[int], samples: int) -> list[dict[str, Any]]:
    rows = []
    for lows in low_levels:
        results, peak = asyncio.run(watched(stack, high_under_low(stack, lows, samples)))
        ok = [r for r in results if not r.error]
        rows.append(
            {
                "lows": lows,
                "failed": len(results) - len(ok),
                "p50": pct([r.first for r in ok], 0.5),
                "p95": pct([r.first for r in ok], 0.95),
                "memory": gb(peak),
            }
        )
        wait_idle()
    base = rows[0]["p50"]
    print(f"\n## `high` first audio while `low` users keep the card busy ({samples} samples)\n")
    print("| low users | high first audio p50 / p95 s | p95 vs alone | peak memory GB | failed |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        print(
            f"| {row['lows']} | {row['p50']:.2f} / {row['p95']:.2f} | {row['p95'] / base:.2f}x "
            f"| {row['memory']:.1f} | {row['failed']} |"
        )
    return rows


def scaling_table(stack: Stack, cards_list: list[int], seconds: float) -> list[dict[str, Any]]:
    rows = []
    for cards in cards_list:
        add_cards(stack, cards)
        rows.append(
            {"cards": cards, "throughput": asyncio.run(saturate(stack, 8 * cards, seconds))}
        )
        wait_idle()
    base = rows[0]["throughput"]
    print(
        f"\n## Throughput on N cards, each kept full (8 users per card; jobs finished "
        f"from 8 s to {seconds:.0f} s)\n"
    )
    print("| cards | jobs/s | vs N x one card |")
    print("| --- | --- | --- |")
    for row in rows:
        print(
            f"| {row['cards']} | {row['throughput']:.2f} "
            f"| {row['throughput'] / (row['cards'] * base):.2f} |"
        )
    return rows


def wait_idle(timeout: float = 120) -> None:
    from synthesis.models import IN_FLIGHT, Job

    deadline = time.monotonic() + timeout
    while Job.objects.filter(status__in=IN_FLIGHT).exists():
        if time.monotonic() > deadline:
            raise SystemExit("jobs still in flight")
        time.sleep(0.2)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    users = [r["users"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(users, PUBLISHED_FIRST, "o--", color="gray", label="published first audio")
    ax.plot(users, [r["first"] for r in rows], "o-", label="Chorus first audio")
    ax.plot(users, PUBLISHED_TOTAL, "s--", color="silver", label="published total")
    ax.plot(users, [r["total"] for r in rows], "s-", label="Chorus total")
    naive = [1.48 + 3.2 * (u - 1) / 2 for u in users]  # one stream at a time, mean wait
    ax.plot(users, naive, ":", color="red", label="one stream per GPU (first audio)")
    ax.set_xlabel("simultaneous users on one T4")
    ax.set_ylabel("seconds")
    ax.set_xticks(users)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=10, help="requests per level, 1-5 users")
    parser.add_argument("--crowd", default="10,20,50")
    parser.add_argument("--lows", default="0,20,50", help="low users under the high samples")
    parser.add_argument("--high-samples", type=int, default=20)
    parser.add_argument("--cards", default="1,2,4")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--plot", default=str(ROOT / "bench" / "out" / "one_gpu.png"))
    args = parser.parse_args()

    def ints(text: str) -> list[int]:
        return [int(n) for n in text.split(",") if n]

    logging.getLogger("httpx").setLevel(logging.WARNING)
    stack = start_stack(cards=1)
    try:
        # Warm: connections, and each tenant's voice prompt in the worker's cache.
        asyncio.run(simultaneous(stack, len(stack.accounts), 1, separate=True))
        rows = published_table(stack, args.requests)
        plot(rows, Path(args.plot))
        if ints(args.crowd):
            crowd_table(stack, ints(args.crowd), rows[0]["first"])
        if ints(args.lows):
            high_table(stack, ints(args.lows), args.high_samples)
        if ints(args.cards):
            scaling_table(stack, ints(args.cards), args.seconds)
        print(f"\nplot: {args.plot}")
    except BaseException:
        for lines in OUTPUT.values():
            sys.stderr.write("".join(lines[-20:]))
        raise
    finally:
        stop_stack(stack)


if __name__ == "__main__":
    main()
