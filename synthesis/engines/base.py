"""The protocol every synthesis engine implements.

An engine is loaded once per worker process (`load`, warm-up included), turns
reference audio into a prepared voice prompt (the expensive, cacheable step) and
synthesizes text with a prepared voice as a stream of audio chunks. Non-streaming
synthesis is just collecting the chunks.

Audio crossing this boundary is always mono float32 numpy arrays in [-1, 1].
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

Samples = npt.NDArray[np.float32]


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

    def load(self) -> None:
        """Load the model and warm it up. Called once per worker process."""

    def info(self) -> EngineInfo: ...

    def prepare_voice(self, reference: ReferenceAudio) -> PreparedVoice: ...

    def synthesize(
        self, *, text: str, voice: PreparedVoice | None, speed: float = 1.0
    ) -> Iterator[Samples]:
        """Yield mono float32 chunks at `self.sample_rate` as they are produced."""
        ...

    def close(self) -> None:
        """Release the model (memory, device reservations)."""
