"""What a load test runs, parsed and checked once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# 80 characters: with the synthetic engine's default 0.06 s per character it
# is 4.8 s of audio, which the README's performance run is calibrated against.
DEFAULT_TEXT = "How many people can use this at once before it feels slow? Let's measure it now."
PRIORITIES = ("high", "normal", "low")
# Measured requests per level. At 10 a level's p95 lies between its two slowest
# requests, so one slow request moves it and the curves zigzag from run to run;
# at 40 it rests on the slowest few.
DEFAULT_REPETITIONS = 40


@dataclass(frozen=True)
class LoadTestOptions:
    url: str
    key: str
    levels: tuple[int, ...] = (1, 2, 3, 4, 5)
    repetitions: int = DEFAULT_REPETITIONS
    duration_s: float | None = None
    warmup: int = 1
    text: str = DEFAULT_TEXT
    voice_id: str | None = None
    priorities: tuple[str, ...] = ("normal",)
    audio_format: str = "wav"
    stream: bool = False
    stream_path: str = "/v1/speech"
    poll_interval_s: float = 0.05
    timeout_s: float = 120.0
    sample_interval_s: float = 0.5
    worker_pids: tuple[int, ...] = ()
    process_patterns: tuple[str, ...] = ()
    output: Path | None = None
    progress: bool = True

    def priority_for(self, index: int) -> str:
        """The priority of the index-th request: the mix, spread evenly."""
        return self.priorities[index % len(self.priorities)]


def parse_levels(value: str) -> tuple[int, ...]:
    """`1,2,3` or ranges such as `1-5,10,20` (in the order given, duplicates dropped)."""
    levels: list[int] = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        low, dash, high = part.partition("-")
        try:
            numbers = range(int(low), int(high) + 1) if dash else [int(low)]
        except ValueError:
            raise ValueError(f"not a concurrency level or range: {part!r}") from None
        for number in numbers:
            if number < 1:
                raise ValueError(f"concurrency levels must be at least 1, not {number}")
            if number not in levels:
                levels.append(number)
    if not levels:
        raise ValueError("no concurrency levels given")
    return tuple(levels)


def parse_priority_mix(value: str) -> tuple[str, ...]:
    """`high:1,low:3` becomes a repeating sequence with the same proportions.

    The sequence interleaves the priorities (smooth weighted round robin), so a
    level of a few requests still sees the mix, not a block of one priority.
    """
    weights: dict[str, int] = {}
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        raw_name, _, weight = part.partition(":")
        name = raw_name.strip()
        if name not in PRIORITIES:
            raise ValueError(f"unknown priority {name!r} (one of {', '.join(PRIORITIES)})")
        try:
            count = int(weight) if weight else 1
        except ValueError:
            raise ValueError(f"not a whole-number weight: {part!r}") from None
        if count < 0:
            raise ValueError(f"weights must not be negative: {part!r}")
        weights[name] = weights.get(name, 0) + count
    total = sum(weights.values())
    if total == 0:
        raise ValueError("the priority mix has no weight")
    current = dict.fromkeys(weights, 0)
    sequence: list[str] = []
    for _ in range(total):
        for name, share in weights.items():
            current[name] += share
        chosen = max(current, key=lambda n: current[n])
        current[chosen] -= total
        sequence.append(chosen)
    return tuple(sequence)
