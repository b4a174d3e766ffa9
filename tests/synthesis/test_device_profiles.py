"""Device profiles: calibrated to the published measurements, saturating past them."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from synthesis.engines.device_profiles import (
    A10_COSYVOICE2,
    GB,
    T4_COSYVOICE2,
    get_profile,
    profile_from_json,
)

T4_FIRST = (1.48, 1.52, 1.61, 1.79, 2.13)
T4_TOTAL = (3.20, 3.45, 3.72, 4.18, 4.96)


@pytest.mark.parametrize("streams", [1, 2, 3, 4, 5])
def test_t4_streams_started_together_reproduce_the_published_table(streams: int) -> None:
    p = T4_COSYVOICE2
    first = (p.first_chunk_delay_s + p.rtf * p.first_chunk_audio_s) * p.slowdown(
        streams, first=True
    )
    total = first + p.rtf * (p.audio_s - p.first_chunk_audio_s) * p.slowdown(streams, first=False)
    assert first == pytest.approx(T4_FIRST[streams - 1], rel=1e-9)
    assert total == pytest.approx(T4_TOTAL[streams - 1], rel=1e-9)


def test_t4_total_time_ratios_are_the_published_ones() -> None:
    ratios = [total / T4_TOTAL[0] for total in T4_TOTAL]
    assert [round(r, 3) for r in ratios] == [1.0, 1.078, 1.163, 1.306, 1.55]
    assert [round(f / T4_FIRST[0], 3) for f in T4_FIRST] == [1.0, 1.027, 1.088, 1.209, 1.439]


def test_throughput_saturates_past_the_last_measured_concurrency() -> None:
    p = T4_COSYVOICE2
    throughput = [n / p.slowdown(n, first=False) for n in range(1, 21)]
    assert throughput[5] == pytest.approx(throughput[4])
    assert throughput[19] == pytest.approx(throughput[4])
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(throughput))
    assert p.slowdown(10, first=True) == pytest.approx(2 * p.slowdown(5, first=True))


def test_t4_memory_holds_seven_streams_beside_the_model() -> None:
    p = T4_COSYVOICE2
    assert p.memory_capacity_streams() == 7
    one_stream = (p.model_bytes + p.stream_bytes) / GB
    assert one_stream == pytest.approx(6.2)
    assert (p.model_bytes + 5 * p.stream_bytes) / GB == pytest.approx(12.8, abs=0.3)


def test_streams_within_a_first_audio_slowdown() -> None:
    assert T4_COSYVOICE2.streams_within(1.5) == 5
    assert T4_COSYVOICE2.streams_within(1.2) == 3
    assert T4_COSYVOICE2.streams_within(1.0) == 1
    assert A10_COSYVOICE2.streams_within(1.2) == 5  # first audio stable with five users


def test_an_operator_profile_loads_from_json(tmp_path: Path) -> None:
    document = {**T4_COSYVOICE2.to_json(), "name": "my-l4", "memory_gb": 24}
    path = tmp_path / "l4.json"
    path.write_text(json.dumps(document))
    profile = get_profile(str(path))
    assert profile.name == "my-l4"
    assert profile.memory_capacity_streams() == 12
    assert profile.slowdown(3, first=True) == T4_COSYVOICE2.slowdown(3, first=True)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"total_s": [3.2]}, "one value per stream count"),
        ({"total_s": [1.0, 1.0, 1.0, 1.0, 1.0]}, "must exceed"),
        ({"memory_gb": None}, "missing or mistypes"),
    ],
)
def test_a_bad_profile_is_refused_with_the_reason(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        profile_from_json({**T4_COSYVOICE2.to_json(), **change})


def test_an_unknown_profile_name_lists_the_shipped_ones() -> None:
    with pytest.raises(ValueError, match="t4-cosyvoice2, a10-cosyvoice2"):
        get_profile("h100-dreams")
