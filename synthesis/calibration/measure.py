"""Measure how one loaded engine behaves at 1, 2, 3, ... streams at once.

Each level starts `n` streams of the same fixed text and reference voice at the
same instant (a barrier) and records, per stream, the time to its first chunk
and to its end; the device's memory is sampled while they run. Levels go up
until first audio passes `stop_slowdown` times a lone stream's (the largest
slowdown that chooses a stream limit: past it no limit can change), until the
device runs out of memory (an answer: the memory limit is the level before), or
until the time or stream bound. The result is a `DeviceProfile` in the JSON
form the workers read (`profile_json`).

The slowdown, which alone chooses the limits, is measured against lone streams
run beside it: every round of `n` streams comes right after a lone stream's
first chunk, and its ratio is to the median of that lone stream and the two
before it (one call far off its usual time counts for nothing; level two starts
with three). The level's slowdown is the median of its rounds' ratios. Whatever
else the host does meanwhile (another worker loading its model, a busy CPU)
then weighs on both sides of each ratio alike, instead of on whichever level
happened to run while it did. The stored first audio at `n` streams is that
slowdown times the median of these lone streams; the time after it is kept as
measured.
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chorus.errors import EngineOutOfMemory
from synthesis.engines.base import Engine, PreparedVoice, ReferenceAudio, close_stream
from synthesis.engines.device_profiles import GB, DeviceProfile, profile_from_json

log = logging.getLogger(__name__)

# One sentence, one upstream text segment: about 4 s of speech, the length of the
# published T4 measurement's requests (67 characters: 4.02 s from the synthetic engine).
TEXT = "Chorus measures how this card speaks with a few voices all at once."
REFERENCE_TRANSCRIPT = "A short reference recording."
MEMORY_SAMPLE_S = 0.02
LONE_PACE_OF = 3  # the last lone streams whose median a round is compared with


@dataclass(frozen=True)
class Level:
    streams: int
    first_audio_s: float  # mean over the level's streams, as measured
    total_s: float
    audio_s: float  # audio one stream produced
    first_chunk_audio_s: float
    memory_bytes: int  # peak device memory above the idle engine, for all streams
    # Median over rounds of the round's first audio over the lone streams' beside it.
    slowdown: float
    out_of_memory: bool = False

    @property
    def rtf(self) -> float:
        return self.total_s / self.audio_s if self.audio_s else 0.0

    @property
    def memory_per_stream(self) -> int:
        return self.memory_bytes // self.streams

    def at_pace(self, lone_first_audio_s: float) -> tuple[float, float]:
        """(first audio, total) with the first audio at this level's slowdown
        from a lone stream's `lone_first_audio_s`, the rest as measured."""
        first = lone_first_audio_s * self.slowdown
        return first, first + self.total_s - self.first_audio_s

    def to_json(self) -> dict[str, Any]:
        return {
            "streams": self.streams,
            "first_audio_s": round(self.first_audio_s, 4),
            "slowdown": round(self.slowdown, 4),
            "total_s": round(self.total_s, 4),
            "rtf": round(self.rtf, 4),
            "memory_per_stream_gb": round(self.memory_per_stream / GB, 4),
            "out_of_memory": self.out_of_memory,
        }


@dataclass
class Calibration:
    name: str
    levels: list[Level] = field(default_factory=list)  # the ones that ran to the end
    stopped_because: str = ""
    memory_total_bytes: int = 0  # 0: the device reports none (CPU)
    model_bytes: int = 0
    out_of_memory_at: int | None = None
    seconds: float = 0.0
    # The first audio of every lone stream measured beside a level of several.
    lone_first_s: list[float] = field(default_factory=list)

    @property
    def lone_first_audio_s(self) -> float:
        """The pace the curve is given at: the median lone stream's first audio
        (level one's where no level of several ran)."""
        if not self.lone_first_s:
            return self.levels[0].first_audio_s
        return statistics.median(self.lone_first_s)

    def profile(self) -> DeviceProfile:
        return profile_from_json(self.profile_json())

    def profile_json(self) -> dict[str, Any]:
        """The profile in the JSON form `CHORUS_DEVICE_PROFILE` files use, plus
        what was measured (`calibration`), which readers ignore."""
        if not self.levels:
            raise ValueError("a calibration without one finished level has no curve")
        stream_bytes = max(level.memory_per_stream for level in self.levels)
        total = self.memory_total_bytes
        if not total:  # no device memory to speak of: nothing limits by memory
            total, stream_bytes = GB, 0
        free = max(0, total - self.model_bytes)
        if self.out_of_memory_at is not None:
            # What failed is the answer: never promise that many streams, whatever
            # the samples said (an allocator may hold memory the samples missed).
            stream_bytes = max(stream_bytes, free // self.out_of_memory_at + 1)
        first = self.levels[0]
        lone = self.lone_first_audio_s
        curve = [level.at_pace(lone) for level in self.levels]
        return {
            "name": self.name,
            "memory_gb": total / GB,
            "model_gb": self.model_bytes / GB,
            "stream_gb": stream_bytes / GB,
            "first_audio_s": [round(first_s, 4) for first_s, _ in curve],
            "total_s": [round(total_s, 4) for _, total_s in curve],
            "audio_s": round(first.audio_s, 4),
            "first_chunk_audio_s": round(first.first_chunk_audio_s, 4),
            "source": f"calibrated: {len(self.levels)} levels in {self.seconds:.0f} s, "
            f"stopped: {self.stopped_because}",
            "calibration": {
                "levels": [level.to_json() for level in self.levels],
                "stopped_because": self.stopped_because,
                "out_of_memory_at": self.out_of_memory_at,
                "lone_first_audio_s": [round(f, 4) for f in self.lone_first_s],
                "seconds": round(self.seconds, 1),
            },
        }


def reference_voice(engine: Engine) -> PreparedVoice:
    """A fixed 3 s tone with a transcript: the same voice on every card."""
    rate = 24000
    t = np.arange(3 * rate, dtype=np.float32) / rate
    samples = (0.2 * np.sin(2 * np.pi * 180 * t)).astype(np.float32)
    reference = ReferenceAudio(samples=samples, sample_rate=rate, transcript=REFERENCE_TRANSCRIPT)
    return engine.prepare_voice(reference)


def device_memory(engine: Engine) -> tuple[int, int] | None:
    """(used, total) bytes of the engine's device, or None where it reports none."""
    probe: Callable[[], tuple[int, int] | None] | None = getattr(engine, "device_memory", None)
    return probe() if probe is not None else None


def calibrate(
    engine: Engine,
    *,
    name: str,
    stop_slowdown: float,
    max_streams: int = 32,
    max_seconds: float = 180.0,
    text: str = TEXT,
    samples: int = 4,
    progress: Callable[[str], None] = log.info,
) -> Calibration:
    """Measure `engine` level by level (see the module's docstring)."""
    started = time.monotonic()
    deadline = started + max_seconds
    voice = reference_voice(engine)
    _one_stream(engine, text, voice)  # warm-up: a first call pays for lazy setup
    memory = device_memory(engine)
    result = Calibration(
        name=name,
        memory_total_bytes=memory[1] if memory else 0,
        model_bytes=memory[0] if memory else 0,
    )
    level_s = 0.0
    for streams in range(1, max_streams + 1):
        # A level that would end past the bound is not started (its time grows at
        # least with its streams' share of the card).
        if result.levels and time.monotonic() + level_s * 1.5 > deadline:
            result.stopped_because = f"time bound ({max_seconds:.0f} s)"
            break
        began = time.monotonic()
        rounds = max(1, math.ceil(samples / streams))
        level = _level(
            engine,
            text,
            voice,
            streams,
            rounds,
            baseline=result.model_bytes,
            deadline=deadline,
            lone=result.lone_first_s,
        )
        level_s = time.monotonic() - began
        if level.out_of_memory:
            result.out_of_memory_at = streams
            result.stopped_because = f"out of memory at {streams} streams"
            progress(f"calibration: {streams} streams: out of memory")
            break
        result.levels.append(level)
        progress(
            f"calibration: {streams} stream(s): first audio {level.first_audio_s:.3f} s "
            f"({level.slowdown:.2f}x a lone stream's), total {level.total_s:.3f} s, "
            f"rtf {level.rtf:.3f}, {level.memory_per_stream / 2**20:.0f} MiB per stream"
        )
        if level.slowdown > stop_slowdown:
            result.stopped_because = f"first audio {level.slowdown:.2f}x one stream's"
            break
    else:
        result.stopped_because = f"stream bound ({max_streams})"
    result.seconds = time.monotonic() - started
    return result


def _level(
    engine: Engine,
    text: str,
    voice: PreparedVoice,
    streams: int,
    rounds: int,
    *,
    baseline: int,
    deadline: float,
    lone: list[float],
) -> Level:
    """One level: the median over `rounds` of each round's mean over its streams
    (a busy host wakes a thread late now and then: the median ignores it). A
    round of several streams follows a lone stream's first chunk; every lone
    first audio is added to `lone`."""
    firsts: list[float] = []
    totals: list[float] = []
    ratios: list[float] = []
    peak = 0
    for round_ in range(rounds):
        if round_ and time.monotonic() > deadline:
            break  # one round is a measurement; more only while time is left
        try:
            if streams > 1:
                # Level one's own rounds are no pace for level two: the host may
                # have been busy just then (what the pairs are for).
                while len(lone) < LONE_PACE_OF - 1:
                    lone.append(_lone_first_audio(engine, text, voice))
                lone.append(_lone_first_audio(engine, text, voice))
            measured, used = streams_together(engine, text, voice, streams)
        except EngineOutOfMemory:
            return Level(streams, 0.0, 0.0, 0.0, 0.0, 0, 0.0, out_of_memory=True)
        first = statistics.fmean(run[0] for run in measured)
        firsts.append(first)
        totals.append(statistics.fmean(run[1] for run in measured))
        ratios.append(first / statistics.median(lone[-LONE_PACE_OF:]) if streams > 1 else 1.0)
        peak = max(peak, used)
    return Level(
        streams=streams,
        first_audio_s=statistics.median(firsts),
        total_s=statistics.median(totals),
        audio_s=measured[0][2],
        first_chunk_audio_s=measured[0][3],
        memory_bytes=max(0, peak - baseline) if peak else 0,
        slowdown=statistics.median(ratios),
    )


def streams_together(
    engine: Engine, text: str, voice: PreparedVoice, streams: int
) -> tuple[list[tuple[float, float, float, float]], int]:
    """Run `streams` streams started at one instant; each one's timings, and the
    peak device memory used meanwhile."""
    barrier = threading.Barrier(streams)
    results: list[tuple[float, float, float, float]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run() -> None:
        try:
            barrier.wait()
            timings = _one_stream(engine, text, voice)
        except BaseException as exc:  # re-raised below, in the caller's thread
            with lock:
                errors.append(exc)
            return
        with lock:
            results.append(timings)

    threads = [threading.Thread(target=run, name=f"calibrate-{i}") for i in range(streams)]
    done = threading.Event()
    peak = [0]

    def sample() -> None:
        while not done.is_set():
            used = device_memory(engine)
            if used is not None:
                peak[0] = max(peak[0], used[0])
            done.wait(MEMORY_SAMPLE_S)

    sampler = threading.Thread(target=sample, name="calibrate-memory", daemon=True)
    sampler.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    sampler.join()
    out_of_memory = [e for e in errors if isinstance(e, EngineOutOfMemory)]
    if out_of_memory:
        raise out_of_memory[0]
    if errors:
        raise errors[0]
    return results, peak[0]


def _lone_first_audio(engine: Engine, text: str, voice: PreparedVoice) -> float:
    """A lone stream's first audio, in seconds; the stream is closed after its
    first chunk (a cancelled stream frees the engine at once). It runs on a
    thread of its own, as every measured stream does: on a busy 2-core host the
    process's main thread took about three times as long for the same call."""
    measured: list[float] = []
    errors: list[BaseException] = []

    def run() -> None:
        began = time.monotonic()
        try:
            stream = engine.synthesize(text=text, voice=voice)
            try:
                next(stream)
                measured.append(time.monotonic() - began)
            finally:
                close_stream(stream)
        except BaseException as exc:  # re-raised below, in the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=run, name="calibrate-lone")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return measured[0]


def _one_stream(
    engine: Engine, text: str, voice: PreparedVoice
) -> tuple[float, float, float, float]:
    """(first audio s, total s, audio s, first chunk's audio s) of one stream."""
    began = time.monotonic()
    first_at = 0.0
    first_samples = samples = 0
    for chunk in engine.synthesize(text=text, voice=voice):
        if not first_at:
            first_at = time.monotonic() - began
            first_samples = len(chunk)
        samples += len(chunk)
    total = time.monotonic() - began
    rate = engine.sample_rate
    return first_at, total, samples / rate, first_samples / rate
