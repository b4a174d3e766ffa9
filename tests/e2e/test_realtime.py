"""Realtime sessions for real: a WebSocket client → uvicorn → PostgreSQL/Redis →
a worker process (the synthetic engine) → the job's stream → the client."""

from __future__ import annotations

import io
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from quotas.models import LedgerEntry, LedgerKind, UsagePeriod
from synthesis.models import Job, JobStatus
from tenants.models import Plan
from tests.conftest import Persona, make_persona
from tests.e2e.asgi import AsgiServer, asgi_server  # noqa: F401  (a fixture)
from tests.e2e.conftest import SYNTHETIC, WorkerProcess, wait_for_job

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# At rtf 0.4 a sentence of 40 characters (2 s of audio) takes 0.8 s to make: a
# cancel or a disconnect lands while it is being spoken.
SLOW = {**SYNTHETIC, "rtf": 0.4, "chunk_s": 0.1}


@dataclass
class Stack:
    server: AsgiServer
    persona: Persona
    worker: WorkerProcess | None
    sentences: bool = False  # the engine takes whole sentences, not a text stream

    @property
    def ws_url(self) -> str:
        return self.server.url.replace("http", "ws", 1) + "/v1/speech/realtime"

    def connect(self, *, token: str | None = None, key: str | None = None) -> ClientConnection:
        if token is not None:
            return connect(f"{self.ws_url}?token={token}", open_timeout=10)
        headers = {"Authorization": f"Bearer {key or self.persona.key}"}
        return connect(self.ws_url, additional_headers=headers, open_timeout=10)


@dataclass
class Heard:
    """What a client received, in order, with when (monotonic) each came."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    audio: list[tuple[float, bytes]] = field(default_factory=list)
    close_code: int | None = None

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [message for message in self.messages if message["type"] == kind]


def listen(ws: ClientConnection, heard: Heard, *, until: str = "", timeout: float = 30) -> Heard:
    """Receive until a message of type `until` (or the close)."""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            frame = ws.recv(timeout=max(0.01, deadline - time.monotonic()))
            if isinstance(frame, bytes):
                heard.audio.append((time.monotonic(), frame))
                continue
            message = json.loads(frame)
            heard.messages.append(message)
            if message["type"] == until:
                return heard
    except ConnectionClosed as closed:
        heard.close_code = closed.rcvd.code if closed.rcvd else None
        return heard
    raise AssertionError(f"no {until!r} within {timeout} s: {heard.messages}")


def send(ws: ClientConnection, kind: str, **fields: Any) -> None:
    ws.send(json.dumps({"type": kind, **fields}))


def start(ws: ClientConnection, **options: Any) -> Heard:
    """Start the session with `options`: what was heard up to `session.started`."""
    send(ws, "session.start", **options)
    return listen(ws, Heard(), until="session.started")


@pytest.fixture
def stack(
    start_worker: Callable[..., WorkerProcess],
    asgi_server: Callable[..., AsgiServer],  # noqa: F811
    plan: Plan,
    tmp_path: Any,
    request: pytest.FixtureRequest,
) -> Iterator[Stack]:
    """A worker whose engine takes a turn's text as it is written, as cosyvoice2
    does (the default), or, parametrized "sentences", sentence by sentence."""
    plan.max_realtime_sessions = 4
    plan.save()
    options = {**SLOW, "state_dir": str(tmp_path / "gpu")}
    if getattr(request, "param", "") == "sentences":
        options["streams_text"] = False
    worker = start_worker(env={"CHORUS_ENGINE_OPTIONS": json.dumps(options)})
    return Stack(
        server=asgi_server(),
        persona=make_persona("alice", plan),
        worker=worker,
        sentences="streams_text" in options,
    )


@pytest.fixture
def web_only(
    asgi_server: Callable[..., AsgiServer],  # noqa: F811
    plan: Plan,
) -> Stack:
    """The web tier alone: what it refuses never reaches a worker."""
    return Stack(server=asgi_server(), persona=make_persona("alice", plan), worker=None)


def _charged(job_id: str) -> int:
    return LedgerEntry.objects.get(job_id=job_id, kind=LedgerKind.COMMIT).characters


BOTH_PATHS = pytest.mark.parametrize("stack", ["text-stream", "sentences"], indirect=True)


@BOTH_PATHS
def test_text_streams_in_and_speech_streams_out_charged_for_what_was_spoken(stack: Stack) -> None:
    pieces = ["Hello ", "there, ", "this is ", "an agent. ", "It writes ", "as it thinks"]
    with stack.connect() as ws:
        heard = start(ws, format="pcm", sample_rate=16000, context_id="turn-1")
        job_id = heard.messages[0]["job_id"]
        first_append = time.monotonic()
        for piece in pieces:
            send(ws, "text.append", text=piece)
            time.sleep(0.025)  # 40 pieces a second, as a language model writes
        send(ws, "text.flush")
        listen(ws, heard, until="audio.done")
        send(ws, "session.close")
        listen(ws, heard, until="session.closed")
        listen(ws, heard)  # to the close
    text = "".join(pieces)
    assert heard.of_type("audio.done")[0] == {
        "type": "audio.done",
        "context_id": "turn-1",
        "characters": len(text),
    }
    # The first sentence was spoken before the rest had arrived.
    assert heard.audio
    assert heard.audio[0][0] - first_append < 6 * 0.025 + 1.0
    pcm = b"".join(data for _, data in heard.audio)
    closed = heard.of_type("session.closed")[0]
    assert closed["characters"] == len(text)
    assert closed["audio_seconds"] == pytest.approx(len(pcm) / 2 / 16000, abs=0.01)
    assert heard.close_code == 1000
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.realtime, job.text, job.characters) == (
        JobStatus.SUCCEEDED,
        True,
        text,
        len(text),
    )
    assert _charged(job_id) == len(text)
    period = UsagePeriod.objects.get(tenant=stack.persona.tenant)
    assert (period.characters_used, period.characters_reserved) == (len(text), 0)


@BOTH_PATHS
def test_a_flush_speaks_the_text_before_it_and_is_answered_before_what_came_after(
    stack: Stack,
) -> None:
    before, after = "Here is the first answer.", " And then the agent goes on"
    with stack.connect() as ws:
        heard = start(ws, format="pcm", sample_rate=16000)
        send(ws, "text.append", text=before)
        send(ws, "text.flush")
        send(ws, "text.append", text=after)  # read together with the flush
        flushed_at = time.monotonic()
        listen(ws, heard, until="audio.done")
        assert time.monotonic() - flushed_at < 5
        send(ws, "text.flush")
        listen(ws, heard, until="audio.done")
        send(ws, "session.close")
        listen(ws, heard, until="session.closed")
    done = heard.of_type("audio.done")
    assert [d["characters"] for d in done] == [len(before), len(after)]
    assert heard.of_type("session.closed")[0]["characters"] == len(before + after)


@BOTH_PATHS
def test_two_flushes_read_together_are_answered_each_for_its_own_text(stack: Stack) -> None:
    one, two = "One thing.", " And another"
    with stack.connect() as ws:
        heard = start(ws, format="pcm", sample_rate=16000)
        for kind, text in (("text.append", one), ("text.flush", ""), ("text.append", two)):
            send(ws, kind, **({"text": text} if text else {}))
        send(ws, "text.flush")
        listen(ws, heard, until="audio.done")
        listen(ws, heard, until="audio.done")
        send(ws, "session.close")
        listen(ws, heard, until="session.closed")
    assert [d["characters"] for d in heard.of_type("audio.done")] == [len(one), len(two)]


@BOTH_PATHS
def test_a_flushed_answer_cancelled_while_it_is_spoken_is_answered_once_as_cancelled(
    stack: Stack,
) -> None:
    text = "This answer was flushed and is spoken for a good while. " * 2
    with stack.connect() as ws:
        heard = start(ws, format="pcm", sample_rate=16000, context_id="a")
        send(ws, "text.append", text=text)
        send(ws, "text.flush")
        while not heard.audio:
            heard.audio.append((time.monotonic(), ws.recv(timeout=10)))  # type: ignore[arg-type]
        send(ws, "context.cancel", context_id="a")
        listen(ws, heard, until="audio.done")
        send(ws, "session.close")
        listen(ws, heard, until="session.closed")
    [done] = heard.of_type("audio.done")
    assert done["cancelled"] is True
    assert done["characters"] == heard.of_type("session.closed")[0]["characters"] > 0


@BOTH_PATHS
def test_a_cancelled_context_stops_at_once_and_is_charged_only_for_what_was_spoken(
    stack: Stack,
) -> None:
    first = "The first answer runs on for a while now. " * 2 + "It never finishes because"
    with stack.connect() as ws:
        heard = start(ws, format="pcm", sample_rate=16000, context_id="a")
        job_id = heard.messages[0]["job_id"]
        send(ws, "text.append", text=first)
        while not heard.audio:
            heard.audio.append((time.monotonic(), ws.recv(timeout=10)))  # type: ignore[arg-type]
        cancelled_at = time.monotonic()
        send(ws, "context.cancel", context_id="a")
        send(ws, "text.append", text="Sorry, go ahead.", context_id="b")
        send(ws, "text.flush", context_id="b")
        listen(ws, heard, until="audio.done")
        listen(ws, heard, until="audio.done")
        # b's text and its flush came together: b's turn is complete at once, not
        # at the idle timeout (20 s).
        assert time.monotonic() - cancelled_at < 5
        send(ws, "session.close")
        listen(ws, heard, until="session.closed")
    done = {message["context_id"]: message for message in heard.of_type("audio.done")}
    assert done["a"]["cancelled"] is True
    if stack.sentences:
        assert 0 < done["a"]["characters"] < len(first)  # one sentence went to the engine
    else:
        assert done["a"]["characters"] == len(first)  # all of it, as it came
    assert done["b"]["characters"] == len("Sorry, go ahead.")
    charged = done["a"]["characters"] + done["b"]["characters"]
    assert heard.of_type("session.closed")[0]["characters"] == charged
    assert _charged(job_id) == charged
    # Barge-in: past the cancel's round trip, only b's audio came.
    b_seconds = len("Sorry, go ahead.") * SYNTHETIC["seconds_per_char"]
    audio_after = sum(len(d) for t, d in heard.audio if t > cancelled_at + 0.1) / 2 / 16000
    assert audio_after <= b_seconds + 0.05


def test_a_browser_connects_once_with_a_client_token(stack: Stack) -> None:
    http = httpx.Client(
        base_url=stack.server.url, headers={"Authorization": f"Bearer {stack.persona.key}"}
    )
    made = http.post("/v1/realtime/tokens", json={"expires_in": 60})
    assert made.status_code == 201, made.text
    token = made.json()["token"]
    assert made.json()["url"].endswith(f"/v1/speech/realtime?token={token}")
    with stack.connect(token=token) as ws:
        heard = start(ws, audio="json", format="wav")
        send(ws, "text.append", text="Hi from a browser.")
        send(ws, "session.close")
        closed_at = time.monotonic()
        listen(ws, heard, until="session.closed")
        assert time.monotonic() - closed_at < 5  # spoken and ended, not left to idle
    audio = heard.of_type("audio")
    assert audio
    assert [a["seq"] for a in audio] == list(range(len(audio)))
    assert audio[0]["context_id"] == "default"
    with stack.connect(token=token) as ws:  # used up
        heard = listen(ws, Heard())
    assert heard.messages[0]["code"] == "invalid_token"
    assert heard.close_code == 4401
    too_long = http.post("/v1/realtime/tokens", json={"expires_in": 601})
    assert too_long.status_code == 400


@pytest.mark.parametrize(
    ("messages", "code", "close_code"),
    [
        ([{"type": "text.append", "text": "hi"}], "session_not_started", 4400),
        ([{"type": "session.start"}, {"type": "speak"}], "unknown_message_type", 4400),
        ([{"type": "session.start"}, b"\x00\x01"], "binary_not_accepted", 4400),
        ([{"type": "session.start", "format": "flac"}], "unsupported_output", 4422),
        (
            [{"type": "session.start"}, {"type": "text.append", "text": "x" * 5001}],
            "session_text_too_long",
            4413,
        ),
    ],
    ids=["no-start", "unknown-type", "binary", "format", "over-the-session-limit"],
)
def test_a_bad_message_gets_an_error_and_a_4xxx_close_and_nothing_is_charged(
    web_only: Stack, messages: list[Any], code: str, close_code: int
) -> None:
    stack = web_only
    with stack.connect() as ws:
        for message in messages:
            ws.send(message if isinstance(message, bytes) else json.dumps(message))
        heard = listen(ws, Heard())
    assert heard.of_type("error")[0]["code"] == code
    assert heard.close_code == close_code
    period = UsagePeriod.objects.filter(tenant=stack.persona.tenant).first()
    if period is not None:
        assert (period.characters_used, period.characters_reserved) == (0, 0)
    for job in Job.objects.filter(tenant=stack.persona.tenant):
        deadline = time.monotonic() + 10
        while job.status != JobStatus.CANCELLED:  # with its client, before any worker took it
            assert time.monotonic() < deadline, job.status
            time.sleep(0.05)
            job.refresh_from_db()
        assert job.characters == 0


@BOTH_PATHS
def test_a_client_that_goes_away_stops_its_synthesis_within_250_ms(stack: Stack) -> None:
    from chorus.redis_client import get_redis

    sentence = "A long answer that the listener will not wait for. " * 3
    unfinished = "and then a thought that never ends"
    with stack.connect() as ws:
        heard = start(ws, format="pcm")
        job_id = heard.messages[0]["job_id"]
        send(ws, "text.append", text=sentence + unfinished)
        ws.recv(timeout=10)  # the first audio
    gone_ms = time.time() * 1000
    job = Job.objects.get(pk=job_id)
    deadline = time.monotonic() + 10
    while job.status != JobStatus.SUCCEEDED:
        assert time.monotonic() < deadline, job.status
        time.sleep(0.05)
        job.refresh_from_db()
    entries = get_redis().xrange(f"chorus:stream:{job_id}")  # type: ignore[union-attr]
    chunk_times = [int(entry_id.split(b"-")[0]) for entry_id, f in entries if f[b"t"] == b"chunk"]
    assert max(chunk_times) - gone_ms <= 250
    # Charged for what went to the engine: a text stream takes all of it as it
    # comes; sentence by sentence, the unfinished one never went.
    sent = len(sentence.rstrip()) if stack.sentences else len(sentence + unfinished)
    assert job.characters == sent


def test_a_worker_that_dies_mid_session_gives_the_client_an_error_within_5_s(
    stack: Stack,
) -> None:
    with stack.connect() as ws:
        heard = start(ws, format="pcm")
        job_id = heard.messages[0]["job_id"]
        send(ws, "text.append", text="Speak on while the worker is lost. " * 4)
        ws.recv(timeout=10)
        assert stack.worker is not None
        os.kill(stack.worker.process.pid, signal.SIGKILL)
        killed = time.monotonic()
        listen(ws, heard, until="error", timeout=10)
        noticed = time.monotonic() - killed
        listen(ws, heard)
    assert heard.of_type("error")[-1]["code"] == "worker_lost"
    assert noticed < 5
    assert heard.close_code == 4503
    job = Job.objects.get(pk=job_id)
    assert job.status == JobStatus.CANCELLED
    period = UsagePeriod.objects.get(tenant=stack.persona.tenant)
    assert period.characters_reserved == 0


@BOTH_PATHS
def test_a_session_without_text_for_the_idle_timeout_ends_with_its_code(
    stack: Stack, plan: Plan
) -> None:
    plan.realtime_idle_timeout_s = 2
    plan.save()
    with stack.connect() as ws:
        heard = start(ws, format="pcm", sample_rate=16000, store=True)
        send(ws, "text.append", text="Then the agent went quiet.")
        appended = time.monotonic()
        heard = listen(ws, heard, timeout=15)
    # Its text is spoken (0.6 s) and the session ends one timeout after the text
    # came, or after it was spoken: not a second timeout later (4.6 s).
    assert time.monotonic() - appended < 4.0
    assert [m["type"] for m in heard.messages[-3:]] == ["audio.done", "error", "session.closed"]
    assert heard.messages[-2]["code"] == "session_idle_timeout"
    assert heard.close_code == 4408
    stored = httpx.get(heard.messages[-1]["audio_url"], timeout=10)
    assert stored.status_code == 200
    assert len(stored.content) == 2 * round(16000 * heard.messages[-1]["audio_seconds"])


def test_while_a_session_speaks_its_card_takes_no_more_streams_than_its_normal_count(
    start_worker: Callable[..., WorkerProcess],
    asgi_server: Callable[..., AsgiServer],  # noqa: F811
    plan: Plan,
    tmp_path: Any,
) -> None:
    # 1 normal stream, 2 high: a `high` job would start beside a `high` session at
    # once, but a session must keep up with real time (synthesis.lanes).
    options = {**SLOW, "state_dir": str(tmp_path / "gpu")}
    start_worker(
        env={"CHORUS_ENGINE_OPTIONS": json.dumps(options), "CHORUS_WORKER_STREAMS": "1,1,2"}
    )
    stack = Stack(server=asgi_server(), persona=make_persona("alice", plan), worker=None)
    http = httpx.Client(
        base_url=stack.server.url, headers={"Authorization": f"Bearer {stack.persona.key}"}
    )
    with stack.connect() as ws:
        heard = start(ws, format="pcm", sample_rate=16000)
        send(ws, "text.append", text="The session is speaking now.")
        send(ws, "text.flush")
        listen(ws, heard, until="audio.done")
        submitted = http.post("/v1/speech", json={"text": "A job in a hurry.", "priority": "high"})
        assert submitted.status_code == 202, submitted.text
        # Another turn, while the job waits (it would have started at once).
        send(ws, "text.append", text="And it goes on speaking for a while longer.")
        send(ws, "text.flush")
        listen(ws, heard, until="audio.done")
        closed_at = time.time()
        send(ws, "session.close")
        listen(ws, heard, until="session.closed")
    job = wait_for_job(http, submitted.json()["id"])
    assert job["status"] == "succeeded"
    started = Job.objects.get(pk=job["id"]).started_at
    assert started is not None
    assert started.timestamp() >= closed_at


def test_a_session_cancelled_through_the_api_tells_its_client_so(stack: Stack) -> None:
    http = httpx.Client(
        base_url=stack.server.url, headers={"Authorization": f"Bearer {stack.persona.key}"}
    )
    with stack.connect() as ws:
        heard = start(ws, format="pcm")
        job_id = heard.messages[0]["job_id"]
        send(ws, "text.append", text="Speak on while the operator cancels this. " * 4)
        ws.recv(timeout=10)
        cancelled = http.post(f"/v1/speech/{job_id}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        listen(ws, heard, until="error", timeout=10)
        listen(ws, heard)
    assert heard.of_type("error")[-1]["code"] == "cancelled"  # not worker_lost
    assert heard.close_code == 4500


@BOTH_PATHS
def test_an_idle_timeout_speaks_another_contexts_flushed_text_before_it_ends(
    stack: Stack, plan: Plan
) -> None:
    plan.realtime_idle_timeout_s = 2
    plan.save()
    with stack.connect() as ws:
        heard = start(ws, format="pcm", sample_rate=16000, context_id="a")
        send(ws, "text.append", text="An answer left open")  # never flushed
        send(ws, "text.append", text="Another answer.", context_id="b")
        send(ws, "text.flush", context_id="b")
        heard = listen(ws, heard, timeout=20)
    kinds = [(m["type"], m.get("context_id") or m.get("code")) for m in heard.messages]
    assert ("audio.done", "b") in kinds
    assert kinds.index(("audio.done", "b")) < kinds.index(("error", "session_idle_timeout"))
    done_b = next(m for m in heard.messages if m.get("context_id") == "b")
    assert done_b["characters"] == len("Another answer.")


def test_a_turn_that_runs_past_the_sessions_longest_ends_it_on_time(
    stack: Stack, plan: Plan
) -> None:
    plan.max_session_seconds = 3
    plan.save()
    with stack.connect() as ws:
        heard = start(ws, format="pcm", sample_rate=16000)
        started = time.monotonic()
        ended = None
        # An agent that writes on and on without a flush: one turn of its engine.
        while ended is None and time.monotonic() - started < 10:
            send(ws, "text.append", text="and on ")
            try:
                while True:
                    frame = ws.recv(timeout=0.2)
                    if isinstance(frame, str) and json.loads(frame)["type"] == "error":
                        heard.messages.append(json.loads(frame))
                        ended = time.monotonic() - started
                        break
            except TimeoutError:
                pass
            except ConnectionClosed:
                break
    assert heard.messages[-1]["code"] == "session_too_long"
    assert ended is not None
    assert ended < 5


def _spectrum(audio: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(frequencies, magnitudes) of some mp3 audio (the synthetic engine speaks a
    tone per text)."""
    samples, rate = soundfile.read(io.BytesIO(audio), dtype="float32")
    return np.fft.rfftfreq(len(samples), 1 / rate), np.abs(np.fft.rfft(samples))


def _tone_hz(freqs: np.ndarray, spectrum: np.ndarray) -> float:
    return float(freqs[int(np.argmax(spectrum))])


# Sentence by sentence: the synthetic engine's tone follows each unit's text, so
# the two contexts' audio can be told apart.
@pytest.mark.parametrize("stack", ["sentences"], indirect=True)
def test_mp3_after_a_cancel_carries_nothing_of_the_cancelled_context(stack: Stack) -> None:
    with stack.connect() as ws:
        heard = start(ws, format="mp3", sample_rate=24000, context_id="a")
        send(ws, "text.append", text="The first answer runs on for a good while now. " * 3)
        while len(heard.audio) < 3:
            heard.audio.append((time.monotonic(), ws.recv(timeout=10)))  # type: ignore[arg-type]
        before = b"".join(data for _, data in heard.audio)
        send(ws, "context.cancel", context_id="a")
        listen(ws, heard, until="audio.done")
        after_cancel = len(heard.audio)
        send(ws, "text.append", text="Sorry, go ahead, I am listening to you now.", context_id="b")
        send(ws, "session.close")
        listen(ws, heard, until="session.closed")
    # b's audio is MPEG frames of their own: it decodes alone, with none of a's tone.
    b_audio = b"".join(data for _, data in heard.audio[after_cancel:])
    freqs, spectrum = _spectrum(b_audio)
    a_hz, b_hz = _tone_hz(*_spectrum(before)), _tone_hz(freqs, spectrum)
    assert abs(a_hz - b_hz) > 20  # two texts, two tones
    near = (np.abs(freqs - a_hz) < 5).nonzero()[0]
    # None of a's tone in b's audio (LAME held up to a frame of it at the cancel).
    assert spectrum[near].max() < 0.01 * spectrum.max()
