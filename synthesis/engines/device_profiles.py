"""How one GPU behaves when it serves several streams at once, from measurements.

A profile is calibrated to a published measurement of CosyVoice2 on a real card:
first audio and total time of a streaming request at 1, 2, ... streams running
at once, the card's memory, and what the model and each active stream take of
it. From those it answers what the emulated device needs:

* `slowdown(n, first=...)`: how much longer a stream's work takes while `n`
  streams share the card. The time up to the first chunk follows the
  first-audio ratios; the rest of the stream follows the ratio of the time
  after first audio, so `n` identical streams started together reproduce both
  published columns exactly.
* Past the last measured concurrency the card is taken as saturated: its
  throughput (streams / slowdown) stays at the last measured value, so each
  further stream costs its full share of time. The T4 numbers show why: from
  4 to 5 streams throughput grew by only 5 % and utilisation was 95 %+ from
  three streams on; assuming more would promise capacity nobody measured.
* `memory_capacity_streams()`: the most streams whose memory fits beside the
  model; the next one fails like CUDA out of memory.
* `streams_within(slowdown)`: the most streams whose first audio stays within
  a factor of one stream's: what a worker's stream limits are derived from.

Operators describe their own card in the same JSON form (`profile_from_json`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GB = 1000**3  # cards and the measurements are quoted in decimal gigabytes
# "No limit from memory": a profile whose streams take no memory of their own.
UNBOUNDED = 1024


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    memory_bytes: int
    model_bytes: int
    stream_bytes: int
    # Published first audio and total time (seconds) at 1, 2, ... streams at once.
    first_audio_s: tuple[float, ...]
    total_s: tuple[float, ...]
    # Audio length of the measured request; with the first chunk's length it
    # sets the single-stream real-time factor of the rest of the stream.
    audio_s: float = 4.0
    first_chunk_audio_s: float = 1.0
    source: str = ""
    _first_ratio: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _rest_ratio: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.first_audio_s or len(self.first_audio_s) != len(self.total_s):
            raise ValueError("first_audio_s and total_s need one value per stream count")
        if any(f <= 0 or t <= f for f, t in zip(self.first_audio_s, self.total_s, strict=True)):
            raise ValueError("each total_s must exceed its first_audio_s, both positive")
        if self.memory_bytes <= 0 or min(self.model_bytes, self.stream_bytes) < 0:
            raise ValueError("memory sizes must be positive")
        if not 0 < self.first_chunk_audio_s < self.audio_s:
            raise ValueError("first_chunk_audio_s must be positive and below audio_s")
        first = self.first_audio_s
        rest = [t - f for f, t in zip(self.first_audio_s, self.total_s, strict=True)]
        object.__setattr__(self, "_first_ratio", tuple(f / first[0] for f in first))
        object.__setattr__(self, "_rest_ratio", tuple(r / rest[0] for r in rest))

    # --- single-stream timing (what the synthetic engine spends) ---------------

    @property
    def rtf(self) -> float:
        """Compute seconds per second of audio after the first chunk, alone on the card."""
        rest = self.total_s[0] - self.first_audio_s[0]
        return rest / (self.audio_s - self.first_chunk_audio_s)

    @property
    def first_chunk_delay_s(self) -> float:
        """Fixed cost before the first chunk (prompt, LLM warm-up), alone on the card."""
        return max(0.0, self.first_audio_s[0] - self.rtf * self.first_chunk_audio_s)

    # --- concurrency ------------------------------------------------------------

    def slowdown(self, streams: int, *, first: bool) -> float:
        """Time factor for work done while `streams` streams share the card."""
        ratios = self._first_ratio if first else self._rest_ratio
        n = max(1, streams)
        last = len(ratios)
        if n <= last:
            return ratios[n - 1]
        return ratios[-1] * n / last  # saturated: throughput held at its last value

    def memory_capacity_streams(self) -> int:
        """Streams that fit beside one loaded model."""
        free = self.memory_bytes - self.model_bytes
        return max(0, free // self.stream_bytes) if self.stream_bytes else UNBOUNDED

    def streams_within(self, first_audio_slowdown: float) -> int:
        """The most streams at once whose first audio stays within the factor,
        never past memory; at least one."""
        capacity = min(self.memory_capacity_streams(), UNBOUNDED)
        best = 1
        for n in range(1, capacity + 1):
            if self.slowdown(n, first=True) <= first_audio_slowdown + 1e-9:
                best = n
        return best

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "memory_gb": self.memory_bytes / GB,
            "model_gb": self.model_bytes / GB,
            "stream_gb": self.stream_bytes / GB,
            "first_audio_s": list(self.first_audio_s),
            "total_s": list(self.total_s),
            "audio_s": self.audio_s,
            "first_chunk_audio_s": self.first_chunk_audio_s,
            "source": self.source,
        }


def profile_from_json(document: dict[str, Any]) -> DeviceProfile:
    """A profile from its JSON form (see `to_json`; sizes in decimal GB)."""
    try:
        return DeviceProfile(
            name=str(document["name"]),
            memory_bytes=round(float(document["memory_gb"]) * GB),
            model_bytes=round(float(document["model_gb"]) * GB),
            stream_bytes=round(float(document.get("stream_gb", 0)) * GB),
            first_audio_s=tuple(float(v) for v in document["first_audio_s"]),
            total_s=tuple(float(v) for v in document["total_s"]),
            audio_s=float(document.get("audio_s", 4.0)),
            first_chunk_audio_s=float(document.get("first_chunk_audio_s", 1.0)),
            source=str(document.get("source", "")),
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"device profile is missing or mistypes a field: {exc}") from exc


# CosyVoice2-0.5B on a T4 (16 GB), streaming, a 5 s reference, a short sentence,
# 10 requests per level, 1-5 simultaneous users. Memory: 6.2 GB with one user and
# about 1.6 GB more per further user (6.2 / 7.1 / 8.3 / 10.5 / 12.8 GB measured;
# this model gives 6.2 / 7.8 / 9.4 / 11.0 / 12.6).
T4_COSYVOICE2 = DeviceProfile(
    name="t4-cosyvoice2",
    memory_bytes=16 * GB,
    model_bytes=round(4.6 * GB),
    stream_bytes=round(1.6 * GB),
    first_audio_s=(1.48, 1.52, 1.61, 1.79, 2.13),
    total_s=(3.20, 3.45, 3.72, 4.18, 4.96),
    source="T4, CosyVoice2-0.5B, 1-5 simultaneous streaming users (published load test)",
)

# CosyVoice2-0.5B on an A10 (24 GB), one shared model behind FastAPI: first audio
# stable at 1.6 +/- 0.2 s with up to five users, memory constant at 11.5 GB (the
# allocator keeps what the first streams took, so a stream adds nothing visible).
# Only first audio was published: the first-audio column climbs to the top of the
# published spread (1.8 s at five), and total time is taken to grow as first
# audio does, from a single-stream total in the T4's proportion (3.2 / 1.48).
A10_COSYVOICE2 = DeviceProfile(
    name="a10-cosyvoice2",
    memory_bytes=24 * GB,
    model_bytes=round(11.5 * GB),
    stream_bytes=0,
    first_audio_s=(1.60, 1.65, 1.70, 1.75, 1.80),
    total_s=(3.46, 3.57, 3.68, 3.78, 3.89),
    source="A10, CosyVoice2-0.5B, one shared model, 5 users (published measurement)",
)

PROFILES = {p.name: p for p in (T4_COSYVOICE2, A10_COSYVOICE2)}
DEFAULT_PROFILE = T4_COSYVOICE2.name


def get_profile(name_or_path: str | DeviceProfile | None) -> DeviceProfile:
    """A shipped profile by name, or one described in a JSON file."""
    if isinstance(name_or_path, DeviceProfile):
        return name_or_path
    key = name_or_path or DEFAULT_PROFILE
    if key in PROFILES:
        return PROFILES[key]
    path = Path(key)
    if path.suffix == ".json" and path.is_file():
        return profile_from_json(json.loads(path.read_text()))
    raise ValueError(
        f"unknown device profile {key!r}: use one of {', '.join(PROFILES)} or a .json file"
    )
