"""Engines that misbehave on purpose, wrapping a real one (for its name and rate)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from chorus.errors import EngineError
from synthesis.engines.base import Engine, PreparedVoice, Samples


class FailingEngine:
    """An engine whose synthesis fails outright."""

    def __init__(self, inner: Engine) -> None:
        self.name = inner.name
        self.sample_rate = inner.sample_rate

    def prepare_voice(self, reference: Any) -> PreparedVoice:
        raise AssertionError("no voice in these jobs")

    def synthesize(
        self,
        *,
        text: str,
        voice: PreparedVoice | None,
        speed: float = 1.0,
        instruction: str = "",
    ) -> Iterator[Samples]:
        raise EngineError("The engine could not speak this text.")
