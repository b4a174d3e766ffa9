"""Engines that wrap a real one (for its name and rate): to misbehave on purpose,
or to note what they are asked."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from chorus.errors import EngineError
from synthesis.engines.base import Engine, EngineInfo, PreparedVoice, ReferenceAudio, Samples


class WrappedEngine:
    """A real engine, each call passed on: subclasses change what they need."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.name = inner.name
        self.sample_rate = inner.sample_rate

    def load(self) -> None:
        self.inner.load()

    def info(self) -> EngineInfo:
        return self.inner.info()

    def prepare_voice(self, reference: ReferenceAudio) -> PreparedVoice:
        return self.inner.prepare_voice(reference)

    def dump_voice(self, voice: PreparedVoice) -> bytes:
        return self.inner.dump_voice(voice)

    def load_voice(self, data: bytes) -> PreparedVoice:
        return self.inner.load_voice(data)

    def synthesize(
        self, *, text: str, voice: PreparedVoice | None, speed: float = 1.0, instruction: str = ""
    ) -> Iterator[Samples]:
        return self.inner.synthesize(text=text, voice=voice, speed=speed, instruction=instruction)

    def close(self) -> None:
        self.inner.close()


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
