"""A job's engine started while its claim is on the way to the database.

A worker learns what to synthesize from the row its claim returns: one round trip
to PostgreSQL (1.8 ms p50, 3.4 ms p90 on a 2-core host, `docs/performance.md`),
and until now the engine started only after it, on the path to a stream's first
audio. A job's first message (at its submit, `dispatch.job_publish_created`, or at
its release from `pending`, `dispatch.admission_release`) carries, in a header of
its own, what the engine needs: the text, the tenant and voice (id and
version), speed and instruction. The worker starts the engine's first chunk from
that on a thread of this module's, claims the job meanwhile, and keeps the chunk
only if the claimed row asks for exactly that (`EarlyStart.serves`). Otherwise
(the job was not claimed, its row says something else, a voice changed or left
this process's memory) the job's thread waits for that first chunk, closes the
stream, and then runs the job from its row as before: a job never has two streams
on the device, so the worker's stream limits hold. That wait is the price of a
wasted start: one first chunk, for a message whose job was cancelled while
queued, say.

Only a voice already prepared in this process's memory is used early: a prompt
loaded from storage or computed would be I/O and compute spent on a claim that may
fail. A realtime session, a retry, a republished job and a job with a voice
whose row came without it (a released one, a long text's segment) carry no header
(a first message delivered again, after its worker was lost, still does). A worker of an earlier
release ignores the header; this one runs a message without it as before. The
text travels in the message, in Redis, as it is kept in the database; Celery's
pool would log it at DEBUG, so that logger stays at INFO (`settings.LOGGING`).
"""

from __future__ import annotations

import contextvars
import math
import threading
from collections.abc import Generator, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from chorus.thread_pools import ForkSafeThreads
from synthesis.engines.base import Engine, PreparedVoice, Samples, close_stream
from synthesis.models import Job
from synthesis.voice_cache import VoicePromptCache

# The message header that carries it (Celery passes headers it does not know of
# to the task's request).
HEADER = "chorus_prestart"

# Threads are made only when none is idle, so their number stays at the most
# first chunks this process has had under way at once: its streams, at most.
_MAX_THREADS = 256
# How long a job's thread waits for the engine's thread to take its early start
# up before it claims the job (`EarlyStart`): that takes well under a millisecond.
_START_WAIT_S = 0.05
_threads = ForkSafeThreads(_MAX_THREADS, "first-chunk")


@dataclass(frozen=True)
class Prestart:
    """What a job's engine is asked to make, as its first message carries it."""

    tenant_id: str
    text: str
    voice: tuple[str, int] | None  # (voice id, version)
    speed: float
    instruction: str

    @classmethod
    def of_job(cls, job: Job) -> Prestart | None:
        """For a job row as its submit made it; None for a realtime session, and
        for a row whose voice would take a query to read."""
        if job.realtime:
            return None
        voice: tuple[str, int] | None = None
        if job.voice_id is not None:
            cached = job.voice if Job.voice.is_cached(job) else None  # type: ignore[attr-defined]
            if cached is None:
                return None
            voice = (str(job.voice_id), int(cached.version))
        return cls(
            tenant_id=str(job.tenant_id),
            text=job.text,
            voice=voice,
            speed=float(job.speed),
            instruction=job.instruction,
        )

    def header(self) -> dict[str, Any]:
        return {HEADER: [self.tenant_id, self.text, self.voice, self.speed, self.instruction]}

    @classmethod
    def from_header(cls, value: Any) -> Prestart | None:
        """The header's value read back; None when it is missing or not this
        release's form (the job then starts after its claim, as without it)."""
        try:
            tenant_id, text, voice, speed, instruction = value
            if voice is not None:
                voice_id, version = voice
                voice = (str(voice_id), int(version))
            found = cls(str(tenant_id), text, voice, float(speed), instruction)
        except (TypeError, ValueError, OverflowError):
            return None
        if not (isinstance(text, str) and isinstance(instruction, str)):
            return None
        return found if math.isfinite(found.speed) else None

    @classmethod
    def from_request(cls, headers: Mapping[str, Any]) -> Prestart | None:
        value = headers.get(HEADER)
        return None if value is None else cls.from_header(value)


class EarlyStart:
    """An engine stream started from a `Prestart`, its first chunk under way on a
    thread of this module's (in the task's log context). Either `chunks` takes it
    over, or `close` waits for that first chunk (a generator cannot be closed while
    it runs) and closes the stream: a job's thread never has two streams of its own
    on the device, so its worker's stream limits hold."""

    def __init__(self, prestart: Prestart, voice: PreparedVoice | None, engine: Engine) -> None:
        self.prestart = prestart
        self.voice = voice
        self._outcome: str | None = None  # "served" (taken over) or "closed"

        started = threading.Event()

        def first_chunk() -> tuple[Iterator[Samples], Samples | None]:
            try:
                stream = engine.synthesize(
                    text=prestart.text,
                    voice=voice,
                    speed=prestart.speed,
                    instruction=prestart.instruction,
                )
            finally:
                started.set()
            return stream, next(stream, None)

        self._future: Future[tuple[Iterator[Samples], Samples | None]] = _threads.get().submit(
            contextvars.copy_context().run, first_chunk
        )
        # The claim that follows has the first chunk's time to spare; the
        # engine's start has none. Without this wait the engine's thread took
        # turns for the interpreter with the claim's Python, and started 0.5 ms
        # (p50; 1.4 ms p90) after it was asked. Once it has the stream in hand it
        # keeps the interpreter until it first blocks (or for CPython's switch
        # interval, 5 ms), which is what puts the engine's first steps first.
        started.wait(timeout=_START_WAIT_S)

    def serves(self, job: Job, voice: PreparedVoice | None) -> bool:
        """Whether this stream makes exactly the claimed job's audio: its voice as
        the job's run prepared it (the same object, from the same cache entry),
        and its text, speed and instruction."""
        asked = self.prestart
        return (
            voice is self.voice
            and asked.tenant_id == str(job.tenant_id)
            and asked.text == job.text
            and asked.speed == float(job.speed)
            and asked.instruction == job.instruction
        )

    @property
    def served(self) -> bool:
        """Whether the job's run took this stream over."""
        return self._outcome == "served"

    def chunks(self) -> Iterator[Samples]:
        """The stream from its first chunk (an error of the engine's is raised
        when it is read, as a stream started now would raise it); closing this
        closes it."""
        self._outcome = "served"
        return self._from_first()

    def _from_first(self) -> Generator[Samples, None, None]:
        stream, first = self._future.result()
        try:
            if first is not None:
                yield first
                yield from stream
        finally:
            close_stream(stream)

    def close(self) -> None:
        """Unless `chunks` took the stream over: wait for its first chunk, then
        close it (whatever the engine raised is the job's run's to meet, or no
        one's: the job was not claimed, or asked for something else)."""
        if self._outcome is not None:
            return
        self._outcome = "closed"
        try:
            stream, _ = self._future.result()
        except Exception:
            return  # nothing left open: the engine's generator ended with its error
        close_stream(stream)


def early_start(
    prestart: Prestart | None, *, engine: Engine, prompts: VoicePromptCache | None
) -> EarlyStart | None:
    """The job's engine started from its message's `prestart`, or None when that
    would need more than this process has in memory (or there is none)."""
    if prestart is None:
        return None
    voice: PreparedVoice | None = None
    if prestart.voice is not None:
        if prompts is None:
            return None
        voice_id, version = prestart.voice
        voice = prompts.peek(prestart.tenant_id, voice_id, version, engine.name)
        if voice is None:
            return None
    try:
        return EarlyStart(prestart, voice, engine)
    except RuntimeError:  # the process is on its way out: no new threads
        return None
