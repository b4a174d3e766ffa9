"""Decompression bombs: what validating an upload may cost is bounded before decoding.

Peaks are measured with tracemalloc, which sees numpy's buffers. Before the
limits, the 384 kHz bomb below made validation allocate 179 MiB and each long
file about 23 MiB (61 s of mono float32 decoded, then a copy of it).
"""

from __future__ import annotations

import tracemalloc

import pytest

from chorus.errors import AudioInconsistent, AudioTooLong, ChorusError, SampleRateTooHigh
from synthesis.audio import MAX_EXPANSION, MAX_UPLOAD_SAMPLE_RATE, decode_reference
from tests.audio_files import audio_file, streamed_file

MB = 1024 * 1024
LIMIT = 20 * MB
# As voice_create calls it for the default plan.
UPLOAD = {"max_bytes": LIMIT, "max_sample_rate": MAX_UPLOAD_SAMPLE_RATE}
# Decoding to the cap holds (30 + 30 + 1) s of 48 kHz mono float32: 11.2 MiB.
DECODING_PEAK = 20 * MB
HEADER_PEAK = 1 * MB  # refused from the header: nothing decoded


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """70 s of 384 kHz stereo silence: 215 MB of float32 in about 116 KB of FLAC."""
    return streamed_file(70, 384000, channels=2, format="FLAC", silent=True)


def refusal(data: bytes, **limits: int) -> tuple[ChorusError, int]:
    """The error validating `data` raises, and the peak memory it allocated."""
    tracemalloc.start()
    try:
        with pytest.raises(ChorusError) as caught:
            decode_reference(data, **{"max_bytes": LIMIT, **limits})
        return caught.value, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_384_khz_bomb_is_refused_from_its_header_as_too_high_a_rate(bomb: bytes) -> None:
    assert len(bomb) < 200_000

    error, peak = refusal(bomb, **UPLOAD)

    assert isinstance(error, SampleRateTooHigh)
    assert (error.status, error.code) == (422, "sample_rate_too_high")
    assert error.details == {"limit": 48000, "value": 384000}
    assert peak < HEADER_PEAK


def test_where_its_rate_is_allowed_the_bomb_is_refused_from_its_header_as_too_long(
    bomb: bytes,
) -> None:
    # The rate ceiling of audio already stored (384 kHz): the header's 70 s is
    # past where decoding would stop, so nothing is decoded.
    error, peak = refusal(bomb)

    assert isinstance(error, AudioTooLong)
    assert error.details == {"limit_seconds": 30.0, "value_seconds": 61.0, "original_seconds": 61.0}
    assert "more than 61 seconds" in error.message
    assert peak < HEADER_PEAK


def test_a_silent_bomb_within_the_length_cap_is_refused_as_soon_as_it_outgrows_its_size() -> None:
    data = streamed_file(60, 48000, channels=2, format="FLAC", silent=True)  # about 10 KB

    error, peak = refusal(data, **UPLOAD)

    assert isinstance(error, AudioInconsistent)
    decoded = error.details["decoded_bytes"]
    # Stopped within one 65536-frame block of the ratio, not after 60 s (11.5 MB).
    assert MAX_EXPANSION * len(data) < decoded <= MAX_EXPANSION * len(data) + 65536 * 4
    assert peak < 6 * MB


@pytest.mark.parametrize(
    ("container", "subtype", "most"),
    [
        # libsndfile may estimate an MP3's length, so only decoding says.
        pytest.param("MP3", "MPEG_LAYER_III", DECODING_PEAK, id="mp3-decoded-to-the-cap"),
        pytest.param("OGG", "VORBIS", HEADER_PEAK, id="ogg-refused-from-its-header"),
    ],
)
def test_a_long_compressed_file_is_refused_without_decoding_past_the_cap(
    container: str, subtype: str, most: int
) -> None:
    data = streamed_file(70, 48000, channels=2, format=container, subtype=subtype)

    error, peak = refusal(data, **UPLOAD)

    assert isinstance(error, AudioTooLong)
    assert error.details["value_seconds"] == 61.0
    assert peak < most


def test_a_flac_whose_header_does_not_say_its_length_is_stopped_at_the_cap() -> None:
    flac = bytearray(streamed_file(70, 48000, channels=2, format="FLAC"))
    # STREAMINFO's 36-bit total sample count, 0 for "unknown": the low 4 bits of
    # byte 21 and bytes 22-25 of the file.
    flac[21] &= 0xF0
    flac[22:26] = bytes(4)

    error, peak = refusal(bytes(flac), **UPLOAD)

    assert isinstance(error, AudioTooLong)
    assert error.details["value_seconds"] == 61.0
    assert peak < DECODING_PEAK


def test_a_valid_reference_costs_about_its_own_decoded_size() -> None:
    data = audio_file(10.0, 24000)  # 10 s of mono float32: 0.9 MiB

    tracemalloc.start()
    try:
        decoded = decode_reference(data, **UPLOAD)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert decoded.duration_s == pytest.approx(10.0)
    assert peak < 2 * MB


@pytest.mark.parametrize("sample_rate", [88200, 96000, 192000])
def test_an_upload_above_48_khz_is_refused_before_decoding(sample_rate: int) -> None:
    error, peak = refusal(audio_file(4.0, sample_rate), **UPLOAD)

    assert isinstance(error, SampleRateTooHigh)
    assert error.details == {"limit": 48000, "value": sample_rate}
    assert "at most 48000 Hz" in error.message
    assert peak < HEADER_PEAK
