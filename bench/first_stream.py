"""The first stream after the stack starts against the next ones: time to first audio.

Each round starts a fresh `manage.py runstack --demo` (what `make run` starts: one
synthesis worker, the light workers, the sweeper, one web process) on a data
folder of its own, with the synthetic engine on its default profile (an emulated
T4 running CosyVoice2), waits until it prints its key, then streams `--streams`
requests one after another (`"stream": true, "format": "pcm"`) and notes when
each one's first body byte arrives. Whatever the stack does lazily on its first
request (imports, connections, the worker's first job) shows as the first
stream's excess over the next ones; the engine's own first chunk, alone, is
printed beside them.

Usage (PostgreSQL and Redis as in `make test`; without DATABASE_URL and REDIS_URL
it runs on the embedded defaults, SQLite and the embedded Valkey):
  DATABASE_URL=postgres://postgres@127.0.0.1:5432/chorus_bench \\
  REDIS_URL=redis://127.0.0.1:6379/11 .venv/bin/python bench/first_stream.py --starts 3
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = "Chorus streams the first audio while the rest is still made."


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def stack_env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHORUS_", "PROMETHEUS_"))}
    env.update(
        {
            "CHORUS_DATA_DIR": str(data_dir),
            "CHORUS_ENGINE": "synthetic",
            "CHORUS_ENGINE_OPTIONS": "{}",  # the default profile: an emulated T4
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def fresh_database() -> None:
    """An empty PostgreSQL database for each start, as a new install has: the demo
    tenant of an earlier start has its storage in that start's data folder."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        return
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def engine_first_chunk_s(runs: int = 5) -> float:
    """The engine's own first chunk, alone (median): what no stack can go below."""
    sys.path.insert(0, str(ROOT))
    from synthesis.engines.synthetic import SyntheticEngine

    engine = SyntheticEngine(device="bench-alone", state_dir=tempfile.mkdtemp())
    engine.load()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        stream = engine.synthesize(text=TEXT, voice=None)
        next(stream)
        times.append(time.perf_counter() - started)
        stream.close()
    engine.close()
    return statistics.median(times)


def first_audio_s(url: str, key: str) -> tuple[float, float, float]:
    """(first audio at the client, the job's queue wait, the worker's own first audio)"""
    import httpx

    started = time.perf_counter()
    with httpx.stream(
        "POST",
        f"{url}/v1/speech",
        json={"text": TEXT, "stream": True, "format": "pcm"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    ) as response:
        if response.status_code != 200:
            raise SystemExit(f"{response.status_code}: {response.read()!r}")
        first = 0.0
        for piece in response.iter_raw():  # read whole: the next starts on an idle device
            if piece and not first:
                first = time.perf_counter() - started
    if not first:
        raise SystemExit("a stream without audio")
    job = httpx.get(
        f"{url}/v1/speech/{response.headers['X-Job-Id']}",
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    ).json()
    return first, job["timings"]["queue_wait_s"], job["timings"]["first_audio_s"]


def one_start(streams: int, data_dir: Path) -> list[tuple[float, float, float]]:
    port = free_port()
    env = stack_env(data_dir)
    fresh_database()
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
    )
    process = subprocess.Popen(
        [sys.executable, "manage.py", "runstack", "--demo", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []

    def collect() -> None:
        assert process.stdout is not None
        lines.extend(process.stdout)

    threading.Thread(target=collect, daemon=True).start()
    try:
        deadline = time.monotonic() + 180
        while not re.search(r"saved hello\.wav", "".join(lines)):
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("runstack did not start:\n" + "".join(lines[-60:]))
            time.sleep(0.1)
        [key] = re.findall(r"export CHORUS_KEY=(\S+)", "".join(lines))
        return [first_audio_s(f"http://127.0.0.1:{port}", key) for _ in range(streams)]
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=3, help="fresh stacks to start (3)")
    parser.add_argument("--streams", type=int, default=4, help="streams after each start (4)")
    args = parser.parse_args()
    engine = engine_first_chunk_s()
    firsts: list[float] = []
    nexts: list[float] = []
    for start in range(args.starts):
        with tempfile.TemporaryDirectory(prefix="chorus-first-stream-") as folder:
            streams = one_start(args.streams, Path(folder) / "var")
        shown = (f"{t:.2f} (queue {q:.2f} + worker {w:.2f})" for t, q, w in streams)
        print(f"start {start + 1}: " + "  ".join(shown), flush=True)
        firsts.append(streams[0][0])
        nexts.extend(t for t, _, _ in streams[1:])
    print(f"engine alone, first chunk: {engine:.2f} s")
    print(
        f"first stream after a start, first audio (median of {args.starts}): "
        f"{statistics.median(firsts):.2f} s"
    )
    print(f"next streams, first audio (median of {len(nexts)}): {statistics.median(nexts):.2f} s")


if __name__ == "__main__":
    main()
