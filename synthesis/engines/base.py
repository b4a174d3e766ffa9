"""The protocol every synthesis engine implements.

An engine is loaded once per worker process (`load`, warm-up included), turns
reference audio into a prepared voice prompt (the expensive, cacheable step) and
synthesizes text with a prepared voice as a stream of audio chunks. Non-streaming
synthesis is just collecting the chunks.

Audio crossing this boundary is always mono float32 numpy arrays in [-1, 1].
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from chorus.errors import EngineError, InvalidInput

# The speeds every engine accepts (the API validates the same range).
MIN_SPEED = 0.5
MAX_SPEED = 2.0


def check_speed(speed: float) -> None:
    if not MIN_SPEED <= speed <= MAX_SPEED:
        raise InvalidInput(
            f"speed must be between {MIN_SPEED} and {MAX_SPEED}", details={"speed": speed}
        )


Samples = npt.NDArray[np.float32]


def close_stream(stream: Iterator[Samples]) -> None:
    """End an engine's stream before its last chunk. Engines return generators,
    whose `close` stops the call and frees what it held at once; a plain
    iterator has nothing to stop."""
    close = getattr(stream, "close", None)
    if close is not None:
        close()


@dataclass(frozen=True)
class ReferenceAudio:
    """A decoded, validated reference recording (mono float32)."""

    samples: Samples
    sample_rate: int
    transcript: str = ""
    language: str = ""


@dataclass(frozen=True)
class PreparedVoice:
    """What an engine needs to speak in a voice; `data` is engine-specific."""

    engine: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineInfo:
    name: str
    sample_rate: int
    device: str
    memory_bytes: int


@runtime_checkable
class Engine(Protocol):
    name: str
    sample_rate: int
    # False where the engine can stream only at speed 1.0: at other speeds its audio
    # then arrives in larger pieces (cosyvoice2: one chunk per text segment).
    supports_streaming_speed: bool
    # True where the same text, voice, speed and instruction always give the same
    # samples: a live stream can then switch to a retry's audio without a seam.
    deterministic: bool
    # How many `synthesize` calls may run at once on one loaded engine (threads
    # of one worker): None when the engine sets no limit of its own (the device
    # does), 1 when calls must not overlap.
    max_concurrent_streams: int | None
    # True where `instruction` changes the speech (cosyvoice2's instruct mode). The
    # API refuses an instruction for an engine that would drop it
    # (`instruction_not_supported`) rather than ignoring it silently.
    follows_instructions: bool

    def load(self) -> None:
        """Load the model and warm it up. Called once per worker process."""

    def info(self) -> EngineInfo: ...

    def prepare_voice(self, reference: ReferenceAudio) -> PreparedVoice: ...

    def dump_voice(self, voice: PreparedVoice) -> bytes:
        """Serialize a prepared voice for storage (never pickle: stored bytes are data)."""
        ...

    def load_voice(self, data: bytes) -> PreparedVoice:
        """Rebuild a voice from `dump_voice` output; raise `EngineError` on bad data."""
        ...

    def synthesize(
        self,
        *,
        text: str,
        voice: PreparedVoice | None,
        speed: float = 1.0,
        instruction: str = "",
    ) -> Iterator[Samples]:
        """Yield mono float32 chunks at `self.sample_rate` as they are produced.

        `instruction` is a natural-language style request ("speak cheerfully");
        engines that cannot follow one (`follows_instructions` False) ignore it.
        """
        ...

    def close(self) -> None:
        """Release the model (memory, device reservations)."""


@runtime_checkable
class TextStreamEngine(Protocol):
    """An engine that also takes its text as it is written (a realtime session's):
    `synthesize_text_stream` is given an iterator of text pieces that blocks until
    the next piece comes and ends with the turn, and starts speaking before the
    turn's text is complete. Optional: `streams_text` says whether this loaded
    engine can (cosyvoice2 can, but not with vLLM); the others are given whole
    sentences (`synthesis.realtime.schedule`)."""

    streams_text: bool

    def synthesize_text_stream(
        self, *, texts: Iterator[str], voice: PreparedVoice | None, instruction: str = ""
    ) -> Iterator[Samples]: ...


def dump_json_voice(voice: PreparedVoice) -> bytes:
    """`dump_voice` for engines whose prepared data is plain JSON-able values."""
    return json.dumps({"engine": voice.engine, "data": voice.data}, sort_keys=True).encode()


def load_json_voice(data: bytes, *, engine: str) -> PreparedVoice:
    """Inverse of `dump_json_voice`; refuses another engine's or malformed data."""
    try:
        decoded = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise EngineError(f"stored voice prompt for {engine!r} is not valid JSON") from exc
    if (
        not isinstance(decoded, dict)
        or decoded.get("engine") != engine
        or not isinstance(decoded.get("data"), dict)
    ):
        raise EngineError(f"stored voice prompt was not made by engine {engine!r}")
    return PreparedVoice(engine=engine, data=decoded["data"])
