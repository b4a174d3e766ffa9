"""A recorded run: two levels of five requests with known timings."""

from __future__ import annotations

from datetime import UTC, datetime

from chorus_loadtest.client import Sample
from chorus_loadtest.options import LoadTestOptions
from chorus_loadtest.runner import RunResult
from chorus_loadtest.sampler import MiB, ResourceSummary
from chorus_loadtest.stats import summarize


def sample(level: int, index: int, first: float, total: float, **fields: object) -> Sample:
    values: dict[str, object] = {
        "level": level,
        "index": index,
        "priority": "normal",
        "started": 100.0 + index,
        "ended": 100.0 + index + total,
        "ok": True,
        "submit_s": 0.05,
        "first_audio_s": first,
        "total_s": total,
        "audio_s": 4.8,
        "engine": "synthetic",
        **fields,
    }
    return Sample(**values)  # type: ignore[arg-type]


# Level 1: one user, back to back; 10 s of wall time from 100.0 to 110.0.
ONE_USER = [
    sample(1, 0, 1.5, 2.0, started=100.0, ended=102.0),
    sample(1, 1, 1.6, 2.0, started=102.0, ended=104.0),
    sample(1, 2, 1.7, 2.0, started=104.0, ended=106.0),
    sample(1, 3, 1.8, 2.0, started=106.0, ended=108.0),
    sample(1, 4, 1.4, 2.0, started=108.0, ended=110.0),
]
# Level 2: two users over 8 s; one job failed, one request was rate limited.
TWO_USERS = [
    sample(2, 0, 2.0, 3.0, started=200.0, ended=203.0),
    sample(2, 1, 3.0, 4.0, started=200.0, ended=204.0),
    sample(2, 2, 2.5, 3.5, started=203.0, ended=206.5),
    sample(
        2,
        3,
        0,
        0,
        ok=False,
        error_code="engine_error",
        first_audio_s=None,
        total_s=None,
        audio_s=None,
        started=204.0,
        ended=205.0,
    ),
    sample(
        2,
        4,
        0,
        0,
        ok=False,
        error_code="rate_limited",
        http_status=429,
        first_audio_s=None,
        total_s=None,
        audio_s=None,
        started=206.5,
        ended=208.0,
    ),
]


def recorded_result() -> RunResult:
    options = LoadTestOptions(url="http://chorus.test", key="ck_test", levels=(1, 2), repetitions=5)
    result = RunResult(options=options, started_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    result.samples = ONE_USER + TWO_USERS
    result.levels = [
        summarize(1, ONE_USER, ResourceSummary(samples=3, rss_peak_bytes=200 * MiB)),
        summarize(2, TWO_USERS, ResourceSummary(samples=3, rss_peak_bytes=300 * MiB)),
    ]
    result.wall_s = 20.0
    return result
