"""Engine registry: build an engine by its configured name and load it.

Engine modules are imported lazily so that a worker configured for one engine
never imports (or fails on) the libraries of another.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chorus.errors import EngineUnavailable
from synthesis.engines.base import Engine

ENGINE_NAMES = ("espeak", "synthetic", "cosyvoice2")


def engine_class(name: str) -> type[Engine]:
    """The class behind an engine name (imports only that engine's module)."""
    if name == "espeak":
        from synthesis.engines.espeak import EspeakEngine

        return EspeakEngine
    if name == "synthetic":
        from synthesis.engines.synthetic import SyntheticEngine

        return SyntheticEngine
    if name == "cosyvoice2":
        from synthesis.engines.cosyvoice2 import CosyVoice2Engine

        return CosyVoice2Engine
    raise EngineUnavailable(
        f"unknown engine {name!r}; valid choices: {', '.join(ENGINE_NAMES)}",
        details={"engine": name, "choices": list(ENGINE_NAMES)},
    )


def _build(name: str, options: Mapping[str, Any]) -> Engine:
    return engine_class(name)(**options)


def build_engine(name: str, options: Mapping[str, Any] | None = None) -> Engine:
    """The engine called `name` with `options` (constructor keywords), not loaded."""
    try:
        return _build(name, dict(options or {}))
    except (TypeError, ValueError) as exc:
        # A misspelt or out-of-range option is a deployment mistake: report it as
        # "this engine cannot run here" with the reason, not as a crash.
        raise EngineUnavailable(
            f"invalid options for engine {name!r}: {exc}", details={"engine": name}
        ) from exc


def load_engine(name: str, options: Mapping[str, Any] | None = None) -> Engine:
    """Build the engine called `name` with `options` and load it."""
    engine = build_engine(name, options)
    engine.load()
    return engine
