"""The arithmetic of a load test: percentiles, throughput and growth per level."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from chorus_loadtest.client import Sample
from chorus_loadtest.sampler import ResourceSummary

# Metrics whose growth over the one-user level the report shows.
GROWTH_METRICS = (
    "first_audio_mean",
    "first_audio_p50",
    "first_audio_p95",
    "first_audio_p99",
    "total_mean",
    "total_p50",
    "total_p95",
    "jobs_per_s",
    "audio_s_per_s",
)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation between closest ranks.

    The same definition as numpy's default and spreadsheets' PERCENTILE.INC, so
    operators can check a report against the per-request CSV.
    """
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError("q must be between 0 and 100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def growth(value: float | None, base: float | None) -> float | None:
    """Relative change over the base: 0.25 means 25 % more (None when undefined)."""
    if value is None or base is None or base == 0:
        return None
    return value / base - 1


@dataclass(frozen=True)
class LevelStats:
    concurrency: int
    requests: int
    failures: int
    wall_s: float
    failures_by_code: dict[str, int] = field(default_factory=dict)
    first_audio_mean: float | None = None
    first_audio_p50: float | None = None
    first_audio_p95: float | None = None
    first_audio_p99: float | None = None
    total_mean: float | None = None
    total_p50: float | None = None
    total_p95: float | None = None
    jobs_per_s: float | None = None
    audio_s_per_s: float | None = None
    streamed: int = 0
    resources: ResourceSummary | None = None

    @property
    def succeeded(self) -> int:
        return self.requests - self.failures

    @property
    def failure_rate(self) -> float:
        return self.failures / self.requests if self.requests else 0.0


def summarize(
    concurrency: int, samples: Sequence[Sample], resources: ResourceSummary | None = None
) -> LevelStats:
    """One level's figures. Throughput counts succeeded jobs over the level's
    wall time, from its first submit to the end of its last request."""
    ok = [s for s in samples if s.ok]
    first = [s.first_audio_s for s in ok if s.first_audio_s is not None]
    total = [s.total_s for s in ok if s.total_s is not None]
    audio = [s.audio_s for s in ok if s.audio_s is not None]
    wall = max(s.ended for s in samples) - min(s.started for s in samples) if samples else 0.0
    codes = Counter(s.error_code or "unknown" for s in samples if not s.ok)
    return LevelStats(
        concurrency=concurrency,
        requests=len(samples),
        failures=sum(codes.values()),
        wall_s=wall,
        failures_by_code=dict(sorted(codes.items())),
        first_audio_mean=mean(first),
        first_audio_p50=percentile(first, 50),
        first_audio_p95=percentile(first, 95),
        first_audio_p99=percentile(first, 99),
        total_mean=mean(total),
        total_p50=percentile(total, 50),
        total_p95=percentile(total, 95),
        jobs_per_s=len(ok) / wall if wall > 0 else None,
        audio_s_per_s=sum(audio) / wall if wall > 0 and audio else None,
        streamed=sum(1 for s in samples if s.streamed),
        resources=resources,
    )


def base_level(levels: Sequence[LevelStats]) -> LevelStats | None:
    """The one-user level, or the lowest level run when 1 was not."""
    if not levels:
        return None
    return next((lv for lv in levels if lv.concurrency == 1), min(levels, key=_concurrency))


def growths(level: LevelStats, base: LevelStats | None) -> dict[str, float | None]:
    if base is None:
        return dict.fromkeys(GROWTH_METRICS)
    return {m: growth(getattr(level, m), getattr(base, m)) for m in GROWTH_METRICS}


def _concurrency(level: LevelStats) -> int:
    return level.concurrency
