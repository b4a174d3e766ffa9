"""Realtime sessions under load: first audio, flush to done, playback underruns, barge-in.

The real stack: uvicorn serving `GET /v1/speech/realtime`, real Celery worker
processes, PostgreSQL and Redis. The engine is the synthetic one on the
`t4-cosyvoice2` device profile (`--engine synthetic-t4`: one emulated T4 per
worker, its published timing and curve, 0.06 s of audio per character), or
espeak-ng (`--engine espeak`, the default of `make run`: one stream per worker).

For N sessions at once (`--sessions 1,5,20`), each session is a WebSocket client
(`websockets`' asyncio client) that plays a language model writing a spoken
answer: 3 sentences, a token of 3-5 characters (4 on average) per `text.append`,
in bursts of 5-10 tokens with pauses between them, 40 tokens/s on average. Then
`text.flush`; when its `audio.done` comes, a second answer the same way (the
listener's follow-up, `--think` later), its flush, and `session.close`. Audio is
pcm s16le at 16 kHz in binary frames. Sessions open within `--stagger` seconds,
at random. Per session:

* first audio: from the answer's first `text.append` to the first audio frame;
  also from the append that completed its first sentence (its terminal
  punctuation: the server speaks sentence by sentence), and the second
  answer's first audio from its own first append;
* flush -> done: from each `text.flush` to its `audio.done`;
* underruns: a player starts each answer at its first audio frame and plays in
  real time; whenever its buffer runs dry before the answer's last frame (all of
  which come before its `audio.done`), that is an underrun (gaps under 1 ms are
  timing noise), lasting until the next frame arrives. Events and seconds.

Then barge-in, the same number of sessions at once: each writes a long answer
(8 sentences) the same way and, at its first audio frame, stops writing and
sends `context.cancel`. Measured: from the cancel to the last audio frame that
still arrived (the frames between the cancel and the `audio.done` with
`"cancelled": true`; 0 when none did), and to that `audio.done`.

One tenant opens every session (its plan allows them all); realtime sessions run
at `high` priority. The tenant's broker slots are raised, as in
`bench/first_chunk_latency.py`, so sessions beyond what the workers run wait in
the broker rather than as `pending`. Sessions a worker cannot take yet wait in the
queue: their first audio and first flush -> done include that wait. A session
that fails (an `error` from the server, a wait past `--timeout`) counts in `ok`
only, and its error is listed under the tables.

Usage (PostgreSQL and Redis as in `make test`; about 3 minutes on 2 cores):
  DATABASE_URL=postgres://postgres@127.0.0.1:5432/chorus_bench \\
  REDIS_URL=redis://127.0.0.1:6379/11 .venv/bin/python bench/realtime.py \\
  [--engine synthetic-t4|espeak] [--sessions 1,5,20] [--plot bench/out/realtime.png]

`--quick` runs a much smaller set (levels 1,2, answers of 2 sentences).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chorus.settings")

import harness  # noqa: E402  (sets the benches' DATABASE_URL / REDIS_URL defaults)
from first_chunk_latency import OUTPUT, start_process, wait_idle  # noqa: E402

from chorus.web_server import web_server_argv  # noqa: E402

PATH = "/v1/speech/realtime"
SAMPLE_RATE = 16000
TOKENS_PER_S = 40.0
TOKEN_CHARS = (3, 4, 4, 5)  # 4 characters on average
BURST = (5, 10)  # tokens per burst
# A player's buffer running dry for less than this is timing noise, not a gap.
UNDERRUN_TOLERANCE_S = 0.001
ENGINES: dict[str, dict[str, Any]] = {
    # The profile's own timing: first chunk 1.48 s alone, rtf and curve as published.
    "synthetic-t4": {
        "engine": "synthetic",
        "options": {"profile": "t4-cosyvoice2", "seconds_per_char": 0.06},
    },
    "espeak": {"engine": "espeak", "options": {}},
}
# What a voice agent says: no abbreviations or decimal points, whose full stops
# do not end a sentence.
SENTENCES = [
    "Your order shipped this morning from our Denver warehouse.",
    "It should arrive by Thursday afternoon.",
    "You can follow it with the link in your confirmation email.",
    "The store opens at nine and closes at six on weekdays.",
    "Parking is free for the first two hours.",
    "I can book a table for four at seven tonight.",
    "Would you like me to send the details by text message?",
    "The refund was approved and reaches your card in three to five days.",
    "Your appointment is confirmed for Monday at half past ten.",
    "Please bring your insurance card and a photo ID.",
    "Tomorrow looks sunny, with a high of twenty degrees.",
    "Your balance is two hundred and forty dollars.",
    "I have moved the meeting to Friday, as you asked.",
    "The train leaves from platform three in twelve minutes.",
    "Sorry, that size is out of stock right now!",
    "Shall I let you know when it is back?",
]


class SessionFailed(Exception):
    pass


# --- one client ---------------------------------------------------------------------


@dataclass
class Heard:
    """What one session's client received, stamped (perf_counter) as it came."""

    frames: list[tuple[float, float]] = field(default_factory=list)  # (arrival, audio s)
    seen: dict[str, float] = field(default_factory=dict)  # first of each kind, when
    events: dict[str, asyncio.Event] = field(default_factory=lambda: defaultdict(asyncio.Event))
    done_at_frame: dict[str, int] = field(default_factory=dict)  # context -> frames before
    done: dict[str, dict[str, Any]] = field(default_factory=dict)  # context -> audio.done
    closed: dict[str, Any] = field(default_factory=dict)  # session.closed
    error: str = ""

    def mark(self, name: str, at: float) -> None:
        self.seen.setdefault(name, at)
        self.events[name].set()

    async def wait(self, name: str, timeout: float) -> float:
        """When `name` came; SessionFailed if the connection ended first."""
        wanted = asyncio.ensure_future(self.events[name].wait())
        gone = asyncio.ensure_future(self.events["gone"].wait())
        try:
            await asyncio.wait({wanted, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            wanted.cancel()
            gone.cancel()
        if name in self.seen:
            return self.seen[name]
        raise SessionFailed(self.error or f"no {name} within {timeout:.0f} s")


async def listen(ws: Any, heard: Heard) -> None:
    from websockets.exceptions import ConnectionClosed

    try:
        async for frame in ws:
            at = time.perf_counter()
            if isinstance(frame, bytes):
                heard.frames.append((at, len(frame) / 2 / SAMPLE_RATE))
                heard.mark("audio", at)
                continue
            message = json.loads(frame)
            kind = message["type"]
            if kind == "audio.done":
                context = message["context_id"]
                heard.done[context] = message
                heard.done_at_frame[context] = len(heard.frames)
                heard.mark(f"done:{context}", at)
            elif kind == "session.closed":
                heard.closed = message
            elif kind == "error":
                heard.error = f"{message.get('code')}: {message.get('message')}"
            heard.mark(kind, at)
    except ConnectionClosed:
        pass
    finally:
        heard.mark("gone", time.perf_counter())


def answer(rng: random.Random, sentences: int) -> str:
    return " ".join(rng.sample(SENTENCES, sentences))


def tokens_of(text: str, rng: random.Random) -> list[str]:
    out, at = [], 0
    while at < len(text):
        size = rng.choice(TOKEN_CHARS)
        out.append(text[at : at + size])
        at += size
    return out


@dataclass
class Turn:
    context: str
    text: str
    first_append: float = 0.0
    sentence_sent: float = 0.0  # when the append with the first sentence's end went
    flushed: float = 0.0


async def write(
    ws: Any,
    turn: Turn,
    rng: random.Random,
    *,
    new_context: bool,
    stop: asyncio.Event | None = None,
) -> None:
    """Send `turn.text` as a language model writes it: tokens in bursts of 5-10,
    40 tokens/s on average. Stops before the next token once `stop` is set."""
    tokens = tokens_of(turn.text, rng)
    first_end = turn.text.index(next(c for c in turn.text if c in ".!?")) + 1
    started = time.perf_counter()
    written = 0  # tokens
    position = 0  # characters
    while written < len(tokens):
        burst = tokens[written : written + rng.randint(*BURST)]
        due = started + written / TOKENS_PER_S
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        for token in burst:
            if stop is not None and stop.is_set():
                return
            message: dict[str, Any] = {"type": "text.append", "text": token}
            if new_context and not turn.first_append:
                message["context_id"] = turn.context
            now = time.perf_counter()
            await ws.send(json.dumps(message))
            turn.first_append = turn.first_append or now
            position += len(token)
            if not turn.sentence_sent and position >= first_end:
                turn.sentence_sent = now
        written += len(burst)


async def open_session(url: str, key: str, context: str) -> tuple[Any, Heard, asyncio.Task[None]]:
    from websockets.asyncio.client import connect

    # No compression: pcm hardly compresses, and the CPU is shared with the stack.
    ws = await connect(
        url,
        additional_headers={"Authorization": f"Bearer {key}"},
        open_timeout=30,
        compression=None,
        proxy=None,
    )
    heard = Heard()
    listener = asyncio.create_task(listen(ws, heard))
    await ws.send(
        json.dumps(
            {
                "type": "session.start",
                "format": "pcm",
                "sample_rate": SAMPLE_RATE,
                "context_id": context,
            }
        )
    )
    await heard.wait("session.started", 30)
    return ws, heard, listener


@dataclass
class Conversation:
    turns: list[Turn] = field(default_factory=list)
    heard: Heard = field(default_factory=Heard)
    error: str = ""


async def conversation(
    url: str, key: str, rng: random.Random, *, sentences: int, think: float, timeout: float
) -> Conversation:
    result = Conversation(turns=[Turn("turn-1", answer(rng, sentences))])
    ws = listener = None
    try:
        ws, result.heard, listener = await open_session(url, key, "turn-1")
        heard = result.heard
        await write(ws, result.turns[0], rng, new_context=False)
        result.turns[0].flushed = time.perf_counter()
        await ws.send(json.dumps({"type": "text.flush"}))
        await heard.wait("done:turn-1", timeout)
        await asyncio.sleep(think)
        result.turns.append(Turn("turn-2", answer(rng, sentences)))
        await write(ws, result.turns[1], rng, new_context=True)
        result.turns[1].flushed = time.perf_counter()
        await ws.send(json.dumps({"type": "text.flush"}))
        await ws.send(json.dumps({"type": "session.close"}))
        await heard.wait("done:turn-2", timeout)
        await heard.wait("session.closed", timeout)
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        if ws is not None:
            await ws.close()
        if listener is not None:
            await listener
    return result


@dataclass
class BargeIn:
    heard: Heard = field(default_factory=Heard)
    cancelled: float = 0.0
    error: str = ""


async def barge_in(
    url: str, key: str, rng: random.Random, *, sentences: int, timeout: float
) -> BargeIn:
    result = BargeIn()
    ws = listener = None
    try:
        ws, result.heard, listener = await open_session(url, key, "answer")
        heard = result.heard
        stop = asyncio.Event()
        writer = asyncio.create_task(
            write(ws, Turn("answer", answer(rng, sentences)), rng, new_context=False, stop=stop)
        )
        try:
            await heard.wait("audio", timeout)
            stop.set()  # the listener spoke: the model stops writing
            result.cancelled = time.perf_counter()
            await ws.send(json.dumps({"type": "context.cancel", "context_id": "answer"}))
        finally:
            stop.set()
            await writer
        await heard.wait("done:answer", timeout)
        if not heard.done["answer"].get("cancelled"):
            raise SessionFailed("the answer's audio.done does not say cancelled")
        await ws.send(json.dumps({"type": "session.close"}))
        await heard.wait("session.closed", timeout)
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        if ws is not None:
            await ws.close()
        if listener is not None:
            await listener
    return result


async def at_once(n: int, stagger: float, rng: random.Random, make: Any) -> list[Any]:
    """`n` sessions, each opened at a random moment within `stagger` seconds."""

    async def one(index: int) -> Any:
        own = random.Random(rng.random())
        await asyncio.sleep(own.uniform(0, stagger) if n > 1 else 0.0)
        return await make(own)

    return list(await asyncio.gather(*(one(i) for i in range(n))))


# --- what the figures are -------------------------------------------------------------


def underruns(frames: list[tuple[float, float]]) -> list[float]:
    """The gaps (s) a player that starts at the first frame, in real time, hears."""
    gaps: list[float] = []
    if not frames:
        return gaps
    until = frames[0][0] + frames[0][1]  # the end of what is buffered
    for arrival, seconds in frames[1:]:
        if arrival - until > UNDERRUN_TOLERANCE_S:
            gaps.append(arrival - until)
            until = arrival + seconds
        else:
            until = max(until, arrival) + seconds
    return gaps


def turn_frames(result: Conversation) -> list[list[tuple[float, float]]]:
    """Each answer's frames: the stream is in order, an answer's audio before its
    audio.done."""
    out, start = [], 0
    for turn in result.turns:
        end = result.heard.done_at_frame.get(turn.context, len(result.heard.frames))
        out.append(result.heard.frames[start:end])
        start = end
    return out


def conversation_row(n: int, results: list[Conversation]) -> dict[str, Any]:
    good = [r for r in results if not r.error]
    row: dict[str, Any] = {
        "sessions": n,
        "ok": len(good),
        "errors": [r.error for r in results if r.error],
        "first": [],
        "after_sentence": [],
        "second": [],
        "flush_done": [],
        "underrun_events": 0,
        "underrun_s": 0.0,
        "sessions_underrun": 0,
        "audio_s": [],
    }
    for result in good:
        frames = turn_frames(result)
        first_turn = result.turns[0]
        row["first"].append(frames[0][0][0] - first_turn.first_append)
        row["after_sentence"].append(frames[0][0][0] - first_turn.sentence_sent)
        if frames[1]:
            row["second"].append(frames[1][0][0] - result.turns[1].first_append)
        for turn in result.turns:
            row["flush_done"].append(result.heard.seen[f"done:{turn.context}"] - turn.flushed)
        gaps = [gap for answer_frames in frames for gap in underruns(answer_frames)]
        row["underrun_events"] += len(gaps)
        row["underrun_s"] += sum(gaps)
        row["sessions_underrun"] += bool(gaps)
        row["audio_s"].append(float(result.heard.closed.get("audio_seconds") or 0.0))
    return row


def barge_row(n: int, results: list[BargeIn]) -> dict[str, Any]:
    good = [r for r in results if not r.error]
    row: dict[str, Any] = {
        "sessions": n,
        "ok": len(good),
        "errors": [r.error for r in results if r.error],
        "last_frame": [],
        "done": [],
        "frames_after": 0,
        "audio_after": [],
    }
    for result in good:
        done = result.heard.seen["done:answer"]
        after = [(t, s) for t, s in result.heard.frames if result.cancelled < t <= done]
        row["last_frame"].append(max((t for t, _ in after), default=result.cancelled))
        row["last_frame"][-1] -= result.cancelled
        row["done"].append(done - result.cancelled)
        row["frames_after"] += len(after)
        row["audio_after"].append(sum(s for _, s in after))
    return row


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def p95(values: list[float]) -> float:
    return harness.percentile(values, 0.95) if values else math.nan


def fmt(value: float, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if math.isnan(value) else f"{value * scale:.{digits}f}"


def print_tables(title: str, rows: list[dict[str, Any]], barge_rows: list[dict[str, Any]]) -> None:
    print(f"\n{title}")
    print(
        "conversation: 2 answers per session, written at 40 tokens/s in bursts; seconds"
        " (p50 / p95); underruns over all sessions of the level"
    )
    header = (
        f"{'sessions':>8} {'ok':>5} {'first audio p50':>15} {'p95':>6} "
        f"{'after sentence p50':>18} {'p95':>6} {'2nd answer p50':>14} {'p95':>6} "
        f"{'flush->done p50':>15} {'p95':>6} {'underruns':>9} {'underrun s':>10} "
        f"{'sessions w/ underrun':>20} {'audio s/session':>15}"
    )
    print(header)
    for row in rows:
        print(
            f"{row['sessions']:>8} {row['ok']:>2}/{row['sessions']:<2} "
            f"{fmt(p50(row['first'])):>15} {fmt(p95(row['first'])):>6} "
            f"{fmt(p50(row['after_sentence'])):>18} {fmt(p95(row['after_sentence'])):>6} "
            f"{fmt(p50(row['second'])):>14} {fmt(p95(row['second'])):>6} "
            f"{fmt(p50(row['flush_done'])):>15} {fmt(p95(row['flush_done'])):>6} "
            f"{row['underrun_events']:>9} {row['underrun_s']:>10.2f} "
            f"{row['sessions_underrun']:>20} {fmt(p50(row['audio_s']), digits=1):>15}"
        )
    print("\nbarge-in: context.cancel at the first audio frame of a long answer; ms (p50 / p95)")
    print(
        f"{'sessions':>8} {'ok':>5} {'cancel->last frame p50':>22} {'p95':>6} "
        f"{'cancel->done p50':>16} {'p95':>6} {'frames after cancel':>19} "
        f"{'audio after cancel ms p95':>25}"
    )
    for row in barge_rows:
        print(
            f"{row['sessions']:>8} {row['ok']:>2}/{row['sessions']:<2} "
            f"{fmt(p50(row['last_frame']), 1000, 1):>22} "
            f"{fmt(p95(row['last_frame']), 1000, 1):>6} "
            f"{fmt(p50(row['done']), 1000, 1):>16} {fmt(p95(row['done']), 1000, 1):>6} "
            f"{row['frames_after']:>19} {fmt(p95(row['audio_after']), 1000, 0):>25}"
        )
    for table, table_rows in (("conversation", rows), ("barge-in", barge_rows)):
        for row in table_rows:
            for error in sorted(set(row["errors"])):
                count = row["errors"].count(error)
                print(f"  {table}, {row['sessions']} sessions: {count} failed, {error}")


def plot(rows: list[dict[str, Any]], barge_rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    levels = [r["sessions"] for r in rows]
    first, flush, gaps, barge = axes[0][0], axes[0][1], axes[1][0], axes[1][1]
    for name, label, color in (
        ("first", "from first append", "C0"),
        ("after_sentence", "from first sentence sent", "C1"),
        ("second", "2nd answer, from its first append", "C2"),
    ):
        first.plot(levels, [p50(r[name]) for r in rows], "o-", color=color, label=f"{label} p50")
        first.plot(levels, [p95(r[name]) for r in rows], "s--", color=color, label="p95")
    first.set_title("first audio (s)")
    flush.plot(levels, [p50(r["flush_done"]) for r in rows], "o-", label="p50")
    flush.plot(levels, [p95(r["flush_done"]) for r in rows], "s--", label="p95")
    flush.set_title("text.flush -> audio.done (s)")
    positions = list(range(len(rows)))
    gaps.bar(positions, [r["underrun_s"] for r in rows], color="C3")
    for x, row in zip(positions, rows, strict=True):
        gaps.annotate(
            f"{row['underrun_events']} events", (x, row["underrun_s"]), ha="center", va="bottom"
        )
    gaps.set_xticks(positions, [str(n) for n in levels])
    gaps.set_ylim(bottom=0)
    gaps.set_title("playback underruns, all sessions (s)")
    blevels = [r["sessions"] for r in barge_rows]
    for name, label, color in (
        ("last_frame", "cancel -> last frame", "C4"),
        ("done", "cancel -> audio.done", "C5"),
    ):
        barge.plot(
            blevels, [p50(r[name]) * 1000 for r in barge_rows], "o-", color=color, label=label
        )
        barge.plot(blevels, [p95(r[name]) * 1000 for r in barge_rows], "s--", color=color)
    barge.set_title("barge-in (ms; dashed p95)")
    for ax in (first, flush, barge):
        ax.set_xlabel("concurrent sessions")
        ax.set_xticks(levels, [str(n) for n in levels])
        ax.legend(fontsize=7)
        ax.set_ylim(bottom=0)
    gaps.set_xlabel("concurrent sessions")
    fig.suptitle("Chorus realtime sessions")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- the stack ------------------------------------------------------------------------


def prepare_tenant() -> tuple[Any, str]:
    """The benchmark's tenant on a plan of its own that allows every session."""
    from tenants.models import Plan, Tenant

    tenant, key = harness.http_tenant("bench-realtime")
    plan, _ = Plan.objects.update_or_create(
        name="bench-realtime",
        defaults={
            "monthly_characters": 10**12,
            "requests_per_minute": 10**6,
            "max_concurrent_jobs": 10**4,
            "allowed_priorities": ["high", "normal", "low"],
            "storage_bytes": 10**15,
            "max_realtime_sessions": 10**4,
            "max_session_seconds": 3600,
            "max_session_characters": 100_000,
            "realtime_idle_timeout_s": 120,
        },
    )
    Tenant.objects.filter(pk=tenant.pk).update(plan=plan)
    return tenant, key


def start_stack(engine: str, workers: int) -> tuple[str, list[subprocess.Popen[str]], str]:
    """uvicorn and `workers` worker processes: (ws url, the processes, a line on
    the engine and each worker's stream limits)."""
    from synthesis.stream_limits import worker_stream_limits
    from synthesis.worker import worker_argv

    spec = ENGINES[engine]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "CHORUS_ENGINE": spec["engine"],
        "CHORUS_PUBLIC_URL": url,
        "CHORUS_TENANT_BROKER_SLOTS": "100000",
        "CHORUS_WORKER_DRAIN_S": "5",
    }
    state_dir = tempfile.mkdtemp(prefix="chorus-bench-gpu-")
    limits = worker_stream_limits(
        spec["engine"], {**spec["options"], "state_dir": tempfile.mkdtemp()}
    )
    processes: list[subprocess.Popen[str]] = []
    try:
        processes.append(
            start_process(
                [*web_server_argv(host="127.0.0.1", port=port), "--log-level", "info"],
                env,
                "Uvicorn running",
            )
        )
        for n in range(workers):
            options = dict(spec["options"])
            if spec["engine"] == "synthetic":
                options.update(device=f"t4-{n}", state_dir=state_dir)
            processes.append(
                start_process(
                    worker_argv(hostname=f"realtime{n}@%h"),
                    {**env, "CHORUS_ENGINE_OPTIONS": json.dumps(options)},
                    " ready.",
                )
            )
    except BaseException:
        stop(processes)
        raise
    time.sleep(1.0)  # each consumer connects to the broker
    details = [spec["engine"], *(f"{k}={v}" for k, v in spec["options"].items())]
    described = (
        f"engine {engine} ({', '.join(details)}), {workers} worker(s),"
        f" each running at most {limits.normal} session(s) at once (its normal count:"
        " what keeps up with real time)"
    )
    return url.replace("http", "ws", 1) + PATH, processes, described


def stop(processes: list[subprocess.Popen[str]]) -> None:
    for process in reversed(processes):
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", default=None, help="levels (default 1,5,20; quick 1,2)")
    parser.add_argument("--engine", choices=sorted(ENGINES), default="synthetic-t4")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (T4 cards)")
    parser.add_argument("--sentences", type=int, default=None, help="per answer (3; quick 2)")
    parser.add_argument("--barge-sentences", type=int, default=8)
    parser.add_argument("--think", type=float, default=0.3, help="s between the two answers")
    parser.add_argument("--stagger", type=float, default=1.0, help="s over which sessions open")
    parser.add_argument("--timeout", type=float, default=180.0, help="s for any one wait")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="a much smaller run")
    parser.add_argument("--plot", default="", help="save the figures to this PNG")
    args = parser.parse_args()
    levels = [int(n) for n in (args.sessions or ("1,2" if args.quick else "1,5,20")).split(",")]
    sentences = args.sentences or (2 if args.quick else 3)
    barge_sentences = min(args.barge_sentences, 4) if args.quick else args.barge_sentences

    if os.environ["DATABASE_URL"].startswith("postgres"):
        harness.ensure_database()
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from chorus.redis_client import get_redis
    from synthesis.models import Job

    redis = get_redis()
    assert redis is not None, "realtime sessions need Redis (REDIS_URL)"
    redis.delete(*settings.SYNTH_QUEUES, "unacked", "unacked_index")  # earlier runs' leftovers
    tenant, key = prepare_tenant()
    Job.objects.filter(tenant=tenant).delete()
    rng = random.Random(args.seed)

    began = time.monotonic()
    url, processes, described = start_stack(args.engine, args.workers)
    rows: list[dict[str, Any]] = []
    barge_rows: list[dict[str, Any]] = []
    try:
        # Warm: the worker's first session, the web tier's first connection.
        warm = asyncio.run(
            conversation(url, key, rng, sentences=1, think=0.0, timeout=args.timeout)
        )
        if warm.error:
            raise SystemExit(f"the warm-up session failed: {warm.error}")
        wait_idle(tenant)
        for n in levels:
            print(f"{n} session(s): conversation", file=sys.stderr)
            results = asyncio.run(
                at_once(
                    n,
                    args.stagger,
                    rng,
                    lambda own: conversation(
                        url, key, own, sentences=sentences, think=args.think, timeout=args.timeout
                    ),
                )
            )
            rows.append(conversation_row(n, results))
            wait_idle(tenant)
            print(f"{n} session(s): barge-in", file=sys.stderr)
            barges = asyncio.run(
                at_once(
                    n,
                    args.stagger,
                    rng,
                    lambda own: barge_in(
                        url, key, own, sentences=barge_sentences, timeout=args.timeout
                    ),
                )
            )
            barge_rows.append(barge_row(n, barges))
            wait_idle(tenant)
            Job.objects.filter(tenant=tenant).delete()
    except BaseException:
        for process in processes:
            print("".join(OUTPUT[process.pid][-30:]), file=sys.stderr)
        raise
    finally:
        stop(processes)

    print_tables(
        f"{described}; pcm {SAMPLE_RATE} Hz; machine: {os.cpu_count()} CPUs;"
        f" {time.monotonic() - began:.0f} s",
        rows,
        barge_rows,
    )
    if args.plot:
        plot(rows, barge_rows, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
