"""A realtime session on its worker: text in from the input stream, audio out.

`session_run` reads the session's input (a thread, `InputReader`, so a cancel or
a departed client is seen between two chunks of audio, never after a unit) and
speaks each context's text in units (`schedule`) as it arrives, in the order the
contexts were opened. Each chunk goes to the job's stream tagged with its
context; when a context's text up to a flush (or the close) is spoken, a
`Said` follows it. A cancel stops the context's audio at the next chunk and
drops its waiting text: only what was sent to the engine is charged.

The session ends when its client closes it (everything left is spoken first),
when no text came for the plan's idle timeout, when it reaches the plan's
longest session, or at once when its client went away.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from synthesis.audio_out import resample_for_engine, to_s16le
from synthesis.engines.base import (
    Engine,
    PreparedVoice,
    Samples,
    TextStreamEngine,
    close_stream,
)
from synthesis.realtime.channel import (
    ALIVE_EVERY_S,
    ALIVE_TTL_MS,
    Append,
    Cancel,
    Close,
    Flush,
    Gone,
    Input,
    SessionConfig,
    Start,
    alive_key,
    decode_input,
    input_key,
)
from synthesis.realtime.schedule import next_unit, speakable
from synthesis.stream_protocol import Chunk, Done, Event, Failed, Said
from synthesis.streaming import STREAM_TTL_AFTER_END_S, STREAM_TTL_S, stream_append

log = logging.getLogger(__name__)

# How long the worker waits for the session's start entry (the web tier writes it
# before it publishes the job, so it is there at once unless Redis lost it).
START_WAIT_S = 10.0
# How often a running session checks that it still owns its job (cancelled
# through the API, say).
OWNERSHIP_CHECK_S = 1.0

# How long a cancelled turn's engine may take to reach its next chunk and let
# its stream go, before the next turn (or the session's end) goes on without it.
PRODUCER_JOIN_S = 10.0

# Why a session ended, as the client is told (`Done.ending`); a client's close is "".
IDLE_TIMEOUT = "session_idle_timeout"
TOO_LONG = "session_too_long"
CLIENT_GONE = "client_gone"
NOT_OWNED = "not_owned"


class SessionInputLost(Exception):
    """The session's start never arrived: its input stream is gone."""


class Liveness(threading.Thread):
    """Keeps the session's liveness key set while its worker has it: from its
    claim until its end is published, settling included. A thread of its own:
    an engine under load may take longer than the key lives to make a chunk (a
    busy card's first one), and a job's settling longer than that too; the web
    tier would then call a working worker lost. Deleted once the end is out."""

    def __init__(self, *, client: Any, job_id: uuid.UUID | str) -> None:
        super().__init__(name=f"realtime-alive-{job_id}", daemon=True)
        self.client = client
        self.key = alive_key(job_id)
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(ALIVE_EVERY_S):
            try:
                self.client.set(self.key, "1", px=ALIVE_TTL_MS)
            except Exception as exc:  # Redis away: the web tier cannot read either
                log.warning("session liveness not renewed: %s", exc)

    def __enter__(self) -> Liveness:
        self.client.set(self.key, "1", px=ALIVE_TTL_MS)
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.join(timeout=1)
        with contextlib.suppress(Exception):
            self.client.delete(self.key)


class InputReader(threading.Thread):
    """Reads the session's input stream into a queue. Cancels and the client's
    departure are also marked at once, for the speaking thread to see between
    chunks."""

    def __init__(self, *, client: Any, job_id: uuid.UUID | str) -> None:
        super().__init__(name=f"realtime-input-{job_id}", daemon=True)
        self.client = client
        self.key = input_key(job_id)
        self.items: queue.Queue[Input] = queue.Queue()
        self.cancels: dict[str, int] = {}  # context -> cancels seen
        self.gone = threading.Event()
        self.stopping = threading.Event()
        self.failed: BaseException | None = None

    def run(self) -> None:
        last_id = "0-0"
        try:
            while not self.stopping.is_set():
                reply = self.client.xread({self.key: last_id}, count=256, block=200)
                for entry_id, fields in reply[0][1] if reply else ():
                    last_id = entry_id
                    item = decode_input(fields)
                    if isinstance(item, Cancel):
                        self.cancels[item.context] = self.cancels.get(item.context, 0) + 1
                    elif isinstance(item, Gone):
                        self.gone.set()
                    self.items.put(item)
        except BaseException as exc:  # Redis lost: the session cannot go on
            self.failed = exc
            self.gone.set()

    def cancelled(self, context: str) -> int:
        return self.cancels.get(context, 0)


@dataclass
class _Context:
    id: str
    buffer: str = ""  # text not yet sent to the engine
    turn: int = 0  # units spoken
    # Each flush not yet answered with a Said, in order: how many of the
    # buffer's first characters it asked to be spoken (0: all sent already).
    # Text appended after a flush waits for its own turn.
    flushes: list[int] = field(default_factory=list)
    sent: int = 0  # characters sent to the engine since the last Said
    cancels: int = 0  # cancels taken (the reader counts them as they arrive)

    def take_unit(self, size: int) -> str:
        """The buffer's first `size` characters, now sent to the engine."""
        unit, self.buffer = self.buffer[:size], self.buffer[size:]
        self.flushes = [max(0, at - size) for at in self.flushes]
        return unit

    @property
    def flushed(self) -> int:
        """The text the first waiting flush asks to be spoken now."""
        return self.flushes[0] if self.flushes else 0


@dataclass
class SessionResult:
    text: str  # what was sent to the engine, in order
    characters: int
    samples: Samples | None  # the session's audio, kept when it is to be stored
    audio_samples: int  # samples streamed, at `sample_rate`
    sample_rate: int
    ending: str  # "" for a client's close


class EventSink:
    """The job's stream, written as `synthesis.stream_protocol` says."""

    def __init__(self, *, client: Any, job_id: uuid.UUID | str, attempt: int, engine: Engine):
        self.client = client
        self.job_id = str(job_id)
        self.attempt = attempt
        self.engine = engine.name
        self.deterministic = bool(getattr(engine, "deterministic", False))
        self.sequence = 0

    def chunk(self, pcm: bytes, sample_rate: int, context: str) -> None:
        self._publish(
            Chunk(
                pcm=pcm,
                sample_rate=sample_rate,
                sequence=self.sequence,
                attempt=self.attempt,
                engine=self.engine,
                deterministic=self.deterministic,
                context=context,
            )
        )
        self.sequence += 1

    def said(self, context: _Context, why: str) -> None:
        self._publish(
            Said(context=context.id, characters=context.sent, why=why, attempt=self.attempt)
        )
        context.sent = 0

    def finish(self, ending: str) -> None:
        self._publish(Done(attempt=self.attempt, job_id=self.job_id, ending=ending), end=True)

    def fail(self, *, code: str, message: str) -> None:
        self._publish(Failed(code=code, message=message, attempt=self.attempt), end=True)

    def _publish(self, event: Event, *, end: bool = False) -> None:
        ttl = STREAM_TTL_AFTER_END_S if end else STREAM_TTL_S
        stream_append(self.client, self.job_id, event, ttl=ttl)


@dataclass
class _Session:
    engine: Engine
    voice: PreparedVoice | None
    instruction: str
    sample_rate: int  # of the audio sent (the session's, or the engine's)
    config: SessionConfig
    reader: InputReader
    sink: EventSink
    job_id: str
    owned: Callable[[], bool]
    contexts: dict[str, _Context] = field(default_factory=dict)
    closing: bool = False
    spoken: list[str] = field(default_factory=list)
    characters: int = 0
    audio: list[Samples] = field(default_factory=list)
    audio_samples: int = 0
    checked_at: float = 0.0
    # The last append's arrival, or the end of the last unit or turn spoken: the
    # idle timeout counts time with no text while nothing is being spoken.
    text_at: float = field(default_factory=time.monotonic)
    # The engine thread of the last text-stream turn: a session holds one stream
    # of its card at a time, so a cancelled turn's stream is let go (at its next
    # chunk) before the next turn's starts.
    producer: threading.Thread | None = None
    # A text-stream turn was ended by the idle timeout: the session ends after it
    # (once any flushed text of other contexts is spoken).
    idled: bool = False
    # When the session must end (its plan's longest), and why a turn ended it
    # early (`TOO_LONG`, `NOT_OWNED`): a text-stream turn can run for long.
    ends_at: float = float("inf")
    stopped: str = ""

    def cancel_pending(self, context: _Context) -> bool:
        """Whether a cancel of `context` has come that is not yet taken."""
        return self.reader.cancelled(context.id) != context.cancels

    def let_go(self) -> None:
        if self.producer is not None:
            self.producer.join(timeout=PRODUCER_JOIN_S)
            self.producer = None

    @property
    def streams_text(self) -> bool:
        """Whether the engine takes a turn's text as it is written (cosyvoice2),
        rather than sentence by sentence."""
        return isinstance(self.engine, TextStreamEngine) and self.engine.streams_text

    def context(self, context_id: str) -> _Context:
        if context_id not in self.contexts:
            self.contexts[context_id] = _Context(context_id)
        return self.contexts[context_id]

    def still_owned(self) -> bool:
        now = time.monotonic()
        if now - self.checked_at < OWNERSHIP_CHECK_S:
            return True
        self.checked_at = now
        return self.owned()

    def take(self, item: Input) -> None:
        if isinstance(item, Append):
            self.context(item.context).buffer += item.text
        elif isinstance(item, Flush):
            context = self.context(item.context)
            context.flushes.append(len(context.buffer))
        elif isinstance(item, Cancel):
            context = self.context(item.context)
            context.buffer, context.flushes = "", []
            context.cancels += 1
            self.sink.said(context, "cancel")
        elif isinstance(item, Close):
            self.closing = True

    def ready(self) -> tuple[_Context, str, bool] | None:
        """The first context with a unit to speak now: the context, the unit, and
        whether its text is complete (a flush's or the close's). With an engine
        that streams text, a unit not complete starts a turn that takes the
        context's next appends as they come."""
        for context in self.contexts.values():
            if context.flushed:
                return context, context.take_unit(context.flushed), True
            if self.streams_text:
                if speakable(context.buffer):
                    return context, context.take_unit(len(context.buffer)), self.closing
                continue
            unit, _ = next_unit(context.buffer, turn=context.turn, flush=self.closing)
            if unit:
                return context, context.take_unit(len(unit)), self.closing
        return None

    def answer_flushes(self) -> None:
        """A `Said` for each flush whose text has all been spoken. Not while a
        cancel of its context is on its way (its audio may have been cut short):
        the cancel answers it."""
        for context in self.contexts.values():
            if self.cancel_pending(context):
                continue
            while context.flushes and context.flushes[0] == 0:
                context.flushes.pop(0)
                self.sink.said(context, "flush")

    def send_text(self, context: _Context, text: str) -> None:
        """Count `text` as sent to the engine: what the session is charged for."""
        context.sent += len(text)
        self.characters += len(text)
        self.spoken.append(text)

    def send_audio(self, context: _Context, samples: Samples) -> None:
        out = resample_for_engine(samples, self.engine.sample_rate, self.sample_rate)
        if len(out) == 0:
            return
        self.sink.chunk(to_s16le(out), self.sample_rate, context.id)
        self.audio_samples += len(out)
        if self.config.store:
            self.audio.append(out)

    def speak(self, context: _Context, unit: str, complete: bool) -> bool:
        """Speak `unit` (`complete`: no more text joins it); False if the client
        went away meanwhile."""
        context.turn += 1
        if not speakable(unit) or self.cancel_pending(context):
            return True  # a cancel on its way drops this unit with the rest
        if self.streams_text:
            return self.speak_stream(context, unit, complete=complete)
        cancels = context.cancels
        self.send_text(context, unit)
        stream: Iterator[Samples] = self.engine.synthesize(
            text=unit, voice=self.voice, speed=1.0, instruction=self.instruction
        )
        try:
            for samples in stream:
                if self.reader.gone.is_set():
                    return False
                if self.reader.cancelled(context.id) != cancels:
                    return True  # barge-in: the rest of this unit is dropped
                self.send_audio(context, samples)
        finally:
            close_stream(stream)
        return True

    def speak_stream(self, context: _Context, first: str, *, complete: bool) -> bool:
        """A turn of `context` spoken by an engine that takes text as it is
        written: from `first` to the context's next flush, a cancel, the close
        or the idle timeout, every append of the context goes to the engine as it
        arrives. The engine runs in a thread of its own, so that this one keeps
        reading the session's input while the engine waits for text. False if
        the client went away meanwhile."""
        assert isinstance(self.engine, TextStreamEngine)
        feed: queue.Queue[str | None] = queue.Queue()
        out: queue.Queue[Samples | BaseException | None] = queue.Queue()
        stop = threading.Event()
        engine = self.engine

        def pieces() -> Iterator[str]:
            while (piece := feed.get()) is not None:
                yield piece

        def produce() -> None:
            try:
                stream = engine.synthesize_text_stream(
                    texts=pieces(), voice=self.voice, instruction=self.instruction
                )
                try:
                    for samples in stream:
                        out.put(samples)
                        if stop.is_set():
                            break
                finally:
                    close_stream(stream)
            except BaseException as exc:
                out.put(exc)
            finally:
                out.put(None)

        cancels = context.cancels
        self.send_text(context, first)
        feed.put(first)
        # A flush or the close read with the turn's text (taken before the turn
        # began) completes it at once: no later one is coming.
        open_feed = not complete
        if complete:
            feed.put(None)
        self.let_go()
        self.producer = threading.Thread(target=produce, name=f"realtime-engine-{self.job_id}")
        self.producer.start()
        try:
            while True:
                while open_feed:
                    try:
                        item = self.reader.items.get_nowait()
                    except queue.Empty:
                        break
                    if isinstance(item, Gone):
                        return False
                    if isinstance(item, Append):
                        self.text_at = time.monotonic()
                        if item.context == context.id:
                            self.send_text(context, item.text)
                            feed.put(item.text)
                            continue
                    if isinstance(item, Close) or (
                        isinstance(item, Flush | Cancel) and item.context == context.id
                    ):
                        feed.put(None)  # the turn's text is complete
                        open_feed = False
                    self.take(item)
                if self.reader.gone.is_set():
                    return False
                if self.reader.cancelled(context.id) != cancels:
                    return True  # barge-in: nothing more of this turn is sent
                now = time.monotonic()
                if now > self.ends_at:
                    self.stopped = TOO_LONG
                    return True
                if not self.still_owned():
                    self.stopped = NOT_OWNED
                    return True
                if open_feed and now - self.text_at > self.config.idle_timeout_s:
                    feed.put(None)  # spoken as a flush would; the session then ends
                    open_feed = False
                    self.idled = True
                try:
                    result = out.get(timeout=0.02)
                except queue.Empty:
                    continue
                if result is None:
                    return True
                if isinstance(result, BaseException):
                    raise result
                self.send_audio(context, result)
                self.text_at = max(self.text_at, time.monotonic())  # not idle: speaking
        finally:
            stop.set()
            if open_feed:
                feed.put(None)


def session_run(
    *,
    job_id: uuid.UUID | str,
    attempt: int,
    engine: Engine,
    voice: PreparedVoice | None,
    instruction: str,
    sample_rate: int | None,
    client: Any,
    owned: Callable[[], bool],
) -> tuple[SessionResult, EventSink]:
    """Run the session until it ends; its result, and the sink its end goes to
    (the caller stores the audio and settles the job first)."""
    reader = InputReader(client=client, job_id=job_id)
    reader.start()
    sink = EventSink(client=client, job_id=job_id, attempt=attempt, engine=engine)
    try:
        config = _first_start(reader)
        session = _Session(
            engine=engine,
            voice=voice,
            instruction=instruction,
            sample_rate=sample_rate or engine.sample_rate,
            config=config,
            reader=reader,
            sink=sink,
            job_id=str(job_id),
            owned=owned,
        )
        session.context(config.context)
        try:
            ending = _loop(session)
        finally:
            session.let_go()
        if ending != CLIENT_GONE:
            for context in session.contexts.values():
                if context.sent:  # spoken, but not yet answered with a said
                    session.sink.said(context, "close")
        samples = np.concatenate(session.audio) if session.audio else None
        return (
            SessionResult(
                text="".join(session.spoken),
                characters=session.characters,
                samples=samples,
                audio_samples=session.audio_samples,
                sample_rate=session.sample_rate,
                ending=ending,
            ),
            sink,
        )
    finally:
        reader.stopping.set()
        reader.join(timeout=1)


def _first_start(reader: InputReader) -> SessionConfig:
    try:
        item = reader.items.get(timeout=START_WAIT_S)
    except queue.Empty:
        raise SessionInputLost("the session's start never arrived") from None
    if not isinstance(item, Start):
        raise SessionInputLost(f"the session's input began with {type(item).__name__}")
    return item.config


def _loop(session: _Session) -> str:
    config = session.config
    session.text_at = time.monotonic()
    session.ends_at = session.text_at + config.max_seconds
    wait = 0.0  # for the next input, when there is nothing to speak
    while True:
        if session.reader.failed is not None:
            raise session.reader.failed
        # Everything that came meanwhile: a cancel must be seen before its
        # context's next unit is taken.
        while True:
            try:
                item = session.reader.items.get(timeout=wait)
            except queue.Empty:
                break
            wait = 0.0
            if isinstance(item, Gone):
                return CLIENT_GONE
            if isinstance(item, Append):
                session.text_at = time.monotonic()
            session.take(item)
        # Flushes whose text is spoken are answered before the next unit, which
        # may be long, and after the cancels that came meanwhile.
        session.answer_flushes()
        if session.reader.gone.is_set():
            return CLIENT_GONE
        if session.stopped:
            return session.stopped
        if session.idled:
            session.idled = False
            flushed = any(context.flushed for context in session.contexts.values())
            if not session.closing and not flushed:
                return IDLE_TIMEOUT
        if not session.still_owned():
            return NOT_OWNED
        now = time.monotonic()
        if now > session.ends_at:
            return TOO_LONG
        found = session.ready()
        if found is not None:
            if not session.speak(*found):
                return CLIENT_GONE
            session.text_at = max(session.text_at, time.monotonic())
            wait = 0.0
            continue
        if session.closing:
            return ""
        if now - session.text_at > config.idle_timeout_s:
            return IDLE_TIMEOUT
        wait = 0.1
