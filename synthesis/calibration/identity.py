"""What keys a device profile: everything that changes the curve.

A profile measured on one card holds for another worker only if the card (its
name and memory), the engine, the model's files, the engine's flags (fp16,
TensorRT, vLLM, instances) and the software versions are the same. Each engine
names its own parts (`calibration_identity()`, callable before `load()`, so a
worker can find a stored profile before it loads anything onto the card); the
key is a hash of them with this module's version of the method.
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import dataclass
from typing import Any

from synthesis.engines.base import Engine

# Raised when the way of measuring changes: older profiles then no longer match.
METHOD_VERSION = 1


@dataclass(frozen=True)
class ProfileKey:
    digest: str  # sha256 hex of `parts`
    parts: dict[str, Any]

    @property
    def short(self) -> str:
        return f"{self.parts.get('engine', '?')}/{self.parts.get('card', '?')}/{self.digest[:12]}"


def profile_key(engine: Engine) -> ProfileKey:
    identity = getattr(engine, "calibration_identity", None)
    if identity is None:
        raise ValueError(f"engine {engine.name!r} cannot be calibrated")
    parts = {"engine": engine.name, "method": METHOD_VERSION, **identity()}
    parts.setdefault("versions", {})["python"] = platform.python_version()
    encoded = json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()
    return ProfileKey(digest=hashlib.sha256(encoded).hexdigest(), parts=parts)
