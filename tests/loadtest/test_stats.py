from __future__ import annotations

import struct

import httpx
import pytest

from chorus_loadtest.client import error_code, wav_seconds
from chorus_loadtest.options import parse_levels, parse_priority_mix
from chorus_loadtest.stats import base_level, growth, growths, percentile, summarize
from tests.loadtest.recorded import ONE_USER, TWO_USERS, recorded_result


def test_percentiles_interpolate_between_closest_ranks_like_numpy() -> None:
    values = [1.5, 1.6, 1.7, 1.8, 1.4]
    assert percentile(values, 50) == pytest.approx(1.6)
    assert percentile(values, 95) == pytest.approx(1.78)
    assert percentile(values, 99) == pytest.approx(1.796)
    assert percentile(values, 0) == pytest.approx(1.4)
    assert percentile(values, 100) == pytest.approx(1.8)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_it_summarizes_the_one_user_level() -> None:
    level = summarize(1, ONE_USER)
    assert (level.requests, level.failures, level.failure_rate) == (5, 0, 0.0)
    assert level.wall_s == pytest.approx(10.0)
    assert level.first_audio_mean == pytest.approx(1.6)
    assert level.first_audio_p50 == pytest.approx(1.6)
    assert level.first_audio_p95 == pytest.approx(1.78)
    assert level.first_audio_p99 == pytest.approx(1.796)
    assert (level.total_mean, level.total_p50, level.total_p95) == (2.0, 2.0, 2.0)
    assert level.jobs_per_s == pytest.approx(0.5)
    assert level.audio_s_per_s == pytest.approx(2.4)


def test_it_counts_failures_by_code_and_leaves_them_out_of_latency_and_throughput() -> None:
    level = summarize(2, TWO_USERS)
    assert level.requests == 5
    assert level.failures == 2
    assert level.failure_rate == pytest.approx(0.4)
    assert level.failures_by_code == {"engine_error": 1, "rate_limited": 1}
    assert level.first_audio_mean == pytest.approx(2.5)
    assert level.first_audio_p95 == pytest.approx(2.95)
    assert level.total_mean == pytest.approx(3.5)
    assert level.total_p95 == pytest.approx(3.95)
    # Three succeeded jobs of 4.8 s audio over the level's 8 s of wall time.
    assert level.wall_s == pytest.approx(8.0)
    assert level.jobs_per_s == pytest.approx(0.375)
    assert level.audio_s_per_s == pytest.approx(1.8)


def test_growth_is_relative_to_the_one_user_level() -> None:
    result = recorded_result()
    base = base_level(result.levels)
    assert base is not None
    assert base.concurrency == 1
    grown = growths(result.levels[1], base)
    assert grown["first_audio_mean"] == pytest.approx(0.5625)
    assert grown["total_mean"] == pytest.approx(0.75)
    assert grown["total_p95"] == pytest.approx(0.975)
    assert grown["jobs_per_s"] == pytest.approx(-0.25)
    assert grown["audio_s_per_s"] == pytest.approx(-0.25)
    assert all(value == pytest.approx(0) for value in growths(base, base).values())


def test_growth_uses_the_lowest_level_when_one_user_was_not_run() -> None:
    levels = [summarize(4, TWO_USERS), summarize(2, ONE_USER)]
    base = base_level(levels)
    assert base is not None
    assert base.concurrency == 2


def test_growth_is_undefined_without_a_base_value() -> None:
    assert growth(None, 1.0) is None
    assert growth(1.0, None) is None
    assert growth(1.0, 0.0) is None


def test_a_level_where_everything_failed_has_no_latency() -> None:
    level = summarize(3, TWO_USERS[3:])
    assert level.failure_rate == 1.0
    assert level.first_audio_p50 is None
    assert level.total_mean is None
    assert level.jobs_per_s == 0.0
    assert level.audio_s_per_s is None


def test_concurrency_levels_take_lists_and_ranges() -> None:
    assert parse_levels("1,2,3,4,5") == (1, 2, 3, 4, 5)
    assert parse_levels("1-3, 10,20,50") == (1, 2, 3, 10, 20, 50)
    assert parse_levels("2,2,1") == (2, 1)
    for bad, message in [("", "no concurrency"), ("0", "at least 1"), ("3-x", "not a")]:
        with pytest.raises(ValueError, match=message):
            parse_levels(bad)


def test_a_priority_mix_is_spread_in_its_proportions() -> None:
    assert parse_priority_mix("normal") == ("normal",)
    mix = parse_priority_mix("high:1,low:3")
    assert sorted(mix) == ["high", "low", "low", "low"]
    assert parse_priority_mix("high:1,low:1") in (("high", "low"), ("low", "high"))
    for bad, message in [
        ("urgent:1", "unknown"),
        ("high:x", "whole-number"),
        ("high:0", "no weight"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_priority_mix(bad)


def test_the_error_code_comes_from_the_envelope() -> None:
    envelope = {"error": {"code": "too_many_concurrent_jobs", "message": "", "details": {}}}
    assert error_code(httpx.Response(429, json=envelope)) == "too_many_concurrent_jobs"
    assert error_code(httpx.Response(502, text="Bad Gateway")) == "http_502"


def test_streamed_wav_length_comes_from_its_header_and_size() -> None:
    header = b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE"
    header += b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, 24000, 48000, 2, 16)
    header += b"data" + struct.pack("<I", 0xFFFFFFFF)
    assert wav_seconds(header, len(header) + 48000) == pytest.approx(1.0)
    assert wav_seconds(b"ID3" + bytes(60), 1000) is None
