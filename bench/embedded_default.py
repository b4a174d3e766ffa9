"""The embedded default under load: what `make run` starts, with 1-20 users.

`make run` is SQLite, an embedded Valkey, one worker on the espeak engine (one
stream at a time: espeak-ng is one synthesizer per process), two light workers
(long texts and archives; webhooks), the sweeper and uvicorn. This bench starts
exactly that (`manage.py runstack` on a fresh data folder, no DATABASE_URL or
REDIS_URL), creates a tenant on the `enterprise`
plan (64 jobs in flight, so the plan's limits are not what is measured), and
runs `chorus-loadtest --stream` at 1, 2, 5, 10 and 20 users, each level
`--repetitions` requests (default 100). Every request is a real HTTP submit that
streams its audio; first audio is the first byte of it.

It prints the load test's table (failures by code, first audio and total with
their growth over one user) and the synthesis worker's memory (that process and
its children; the light workers are not counted). With one espeak stream at
a time, first audio grows with the queue ahead of a request: that growth is the
point of the table, failures must stay 0.

Usage (about a minute; nothing else needs to run):
  .venv/bin/python bench/embedded_default.py [--levels 1,2,5,10,20] [--repetitions 100]
"""

from __future__ import annotations

import argparse
import csv
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
TEXT = "Hello from Chorus. This sentence was queued, synthesized and stored."


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def embedded_env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHORUS_", "DATABASE_URL"))}
    env.pop("REDIS_URL", None)
    env["CHORUS_DATA_DIR"] = str(data_dir)
    return env


def manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return result.stdout


class Stack:
    """`manage.py runstack` in the background, its output kept."""

    def __init__(self, env: dict[str, str], port: int) -> None:
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "runstack", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._collect, daemon=True).start()

    def _collect(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    def synthesis_workers(self) -> list[int]:
        """The stack's synthesis worker (`worker1@`), not its light workers:
        matching every `celery` command line would count them too, and any
        other Celery process on the machine."""
        return [
            child.pid
            for child in psutil.Process(self.process.pid).children(recursive=True)
            if any(part.startswith("worker1@") for part in child.cmdline())
        ]

    def wait_up(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any("Chorus is up" in line for line in self.lines):
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        raise SystemExit("the stack did not start:\n" + "".join(self.lines[-40:]))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def problems(self) -> list[str]:
        """Server-side errors in the stack's output (tracebacks, 'database is locked')."""
        return [
            line.rstrip()
            for line in self.lines
            if "Traceback" in line or "database is locked" in line or " ERROR " in line
        ]


def first_jobs(url: str, key: str, count: int = 10) -> list[float]:
    """Seconds to the last byte of `count` jobs in a row, the first right after the
    worker started: 48 kHz mp3, so each one is resampled and encoded."""
    body = {"text": TEXT, "stream": True, "format": "mp3", "sample_rate": 48000}
    times = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}) as http:
        for _ in range(count):
            started = time.perf_counter()
            response = http.post("/v1/speech", json=body, timeout=60)
            response.raise_for_status()
            times.append(time.perf_counter() - started)
    return times


def print_table(csv_path: Path) -> int:
    rows = list(csv.DictReader(csv_path.open()))
    print(
        "\n| users | requests | failed | first audio p50 s | p95 s | growth (p50) "
        "| total p50 s | jobs/s | worker RSS peak MiB |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    failed = 0
    for row in rows:
        failed += int(row["failures"])
        growth = float(row.get("growth_first_audio_p50") or 0)
        codes = f" ({row['failures_by_code']})" if row["failures_by_code"] else ""
        print(
            f"| {row['concurrency']} | {row['requests']} | {row['failures']}{codes} "
            f"| {float(row['first_audio_p50_s']):.3f} | {float(row['first_audio_p95_s']):.3f} "
            f"| {growth * 100:+.0f} % | {float(row['total_p50_s']):.3f} "
            f"| {float(row['jobs_per_s']):.2f} | {row['worker_rss_peak_mib'] or '-'} |"
        )
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="1,2,5,10,20")
    parser.add_argument("--repetitions", type=int, default=100)
    parser.add_argument("--output", default="", help="keep the load test's files here")
    args = parser.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="chorus-embedded-"))
    output = Path(args.output or data_dir / "loadtest")
    env = embedded_env(data_dir)
    manage(env, "migrate", "--noinput")
    key = manage(env, "create_tenant", "bench", "--plan", "enterprise").strip().splitlines()[-1]
    port = free_port()
    stack = Stack(env, port)
    try:
        stack.wait_up()
        warm = first_jobs(f"http://127.0.0.1:{port}", key)
        started = time.monotonic()
        run = subprocess.run(
            [
                str(Path(sys.executable).parent / "chorus-loadtest"),
                "--url",
                f"http://127.0.0.1:{port}",
                "--key",
                key,
                "--concurrency",
                args.levels,
                "--repetitions",
                str(args.repetitions),
                "--stream",
                "--text",
                TEXT,
                *(f"--worker-pid={pid}" for pid in stack.synthesis_workers()),
                "--output",
                str(output),
                "--quiet",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        wall = time.monotonic() - started
    finally:
        stack.stop()
    if not (output / "loadtest.csv").exists():
        print(run.stdout, run.stderr)
        return 1
    print(f"## The embedded default (`make run`: SQLite, embedded Valkey, espeak), {wall:.0f} s")
    failed = print_table(output / "loadtest.csv")
    rest = statistics.median(warm[1:])
    print(
        f"\nfirst job after the worker started: {warm[0]:.3f} s; jobs 2-{len(warm)}: "
        f"median {rest:.3f} s ({warm[0] / rest:.2f}x) (48 kHz mp3, resampled and encoded)"
    )
    problems = stack.problems()
    print(f"\nserver-side errors in the stack's output: {len(problems)}")
    for line in problems[:10]:
        print("  " + line)
    print(f"files: {output}")
    return 1 if failed or problems else 0


if __name__ == "__main__":
    sys.exit(main())
