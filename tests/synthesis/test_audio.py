"""Reference-audio validation: real files made with soundfile, judged by decoding."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from chorus.errors import (
    AudioInconsistent,
    AudioTooLong,
    AudioTooShort,
    EmptyFile,
    FileTooLarge,
    SampleRateTooLow,
    TooManyChannels,
    UnsupportedAudio,
)
from synthesis.audio import audio_duration, decode_reference, encode_wav
from tests.audio_files import audio_file, tone

MB = 1024 * 1024
LIMIT = 20 * MB


def wav_with_claimed_frames(real_seconds: float, claimed_frames: int, sample_rate: int) -> bytes:
    """A PCM16 mono WAV whose header claims `claimed_frames` but holds fewer samples."""
    pcm = (tone(real_seconds, sample_rate) * 32767).astype("<i2").tobytes()
    data_size = claimed_frames * 2
    fmt = struct.pack("<HHIIHH", 1, 1, sample_rate, sample_rate * 2, 2, 16)
    header = (
        b"RIFF"
        + struct.pack("<I", min(36 + data_size, 0xFFFFFFFF))
        + b"WAVEfmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + b"data"
        + struct.pack("<I", data_size)
    )
    return header + pcm


# --- accepted -------------------------------------------------------------------


@pytest.mark.parametrize("sample_rate", [16000, 22050, 44100, 48000])
@pytest.mark.parametrize(
    ("container", "subtype"), [("WAV", "PCM_16"), ("FLAC", "PCM_16"), ("OGG", "VORBIS")]
)
def test_accepts_common_formats_with_their_real_duration(
    container: str, subtype: str, sample_rate: int
) -> None:
    ref = decode_reference(
        audio_file(5.0, sample_rate, format=container, subtype=subtype), max_bytes=LIMIT
    )
    assert ref.format == container
    assert ref.sample_rate == sample_rate
    assert ref.channels == 1
    assert ref.duration_s == pytest.approx(5.0, abs=0.02)
    assert ref.samples.dtype == np.float32
    assert ref.samples.ndim == 1
    assert len(ref.samples) == pytest.approx(5.0 * sample_rate, abs=0.02 * sample_rate)
    assert 0.3 < float(np.abs(ref.samples).max()) <= 1.0


def test_accepts_mp3() -> None:
    # The pinned soundfile wheel bundles a libsndfile with MP3; output formats need it too.
    data = audio_file(6.0, 44100, format="MP3", subtype="MPEG_LAYER_III")
    ref = decode_reference(data, max_bytes=LIMIT)
    assert ref.format == "MP3"
    assert ref.duration_s == pytest.approx(6.0, abs=0.1)


def test_stereo_is_mixed_down_to_mono() -> None:
    sample_rate = 22050
    left = tone(4.0, sample_rate)
    stereo = np.stack([left, np.zeros_like(left)], axis=1)
    buffer = io.BytesIO()
    sf.write(buffer, stereo, sample_rate, format="WAV", subtype="FLOAT")
    ref = decode_reference(buffer.getvalue(), max_bytes=LIMIT)
    assert ref.channels == 2
    assert ref.samples.ndim == 1
    np.testing.assert_allclose(ref.samples, left / 2, atol=1e-6)


def test_boundaries_are_inclusive() -> None:
    assert decode_reference(audio_file(3.0), max_bytes=LIMIT).duration_s == pytest.approx(3.0)
    assert decode_reference(audio_file(30.0), max_bytes=LIMIT).duration_s == pytest.approx(30.0)


def test_content_decides_not_the_file_name(tmp_path: Path) -> None:
    misnamed = tmp_path / "voice.wav"
    misnamed.write_bytes(audio_file(4.0, format="FLAC"))
    assert decode_reference(misnamed.read_bytes(), max_bytes=LIMIT).format == "FLAC"
    not_audio = tmp_path / "voice.mp3"
    not_audio.write_bytes(b"definitely not an mp3\n" * 200)
    with pytest.raises(UnsupportedAudio):
        decode_reference(not_audio.read_bytes(), max_bytes=LIMIT)


# --- refused --------------------------------------------------------------------


def test_empty_bytes() -> None:
    with pytest.raises(EmptyFile):
        decode_reference(b"", max_bytes=LIMIT)


def test_over_max_bytes_is_refused_before_decoding() -> None:
    data = audio_file(10.0, 48000)
    with pytest.raises(FileTooLarge) as caught:
        decode_reference(data, max_bytes=len(data) - 1)
    assert caught.value.details == {"limit_bytes": len(data) - 1, "size_bytes": len(data)}
    # Size is judged first: oversized garbage is "too large", not "unsupported".
    with pytest.raises(FileTooLarge):
        decode_reference(b"x" * 101, max_bytes=100)


def test_too_many_channels() -> None:
    with pytest.raises(TooManyChannels) as caught:
        decode_reference(audio_file(5.0, channels=3), max_bytes=LIMIT)
    assert caught.value.details == {"limit": 2, "value": 3}


def test_sample_rate_too_low() -> None:
    with pytest.raises(SampleRateTooLow) as caught:
        decode_reference(audio_file(5.0, 8000), max_bytes=LIMIT)
    assert caught.value.details["value"] == 8000


def test_too_short() -> None:
    with pytest.raises(AudioTooShort) as caught:
        decode_reference(audio_file(2.0), max_bytes=LIMIT)
    assert caught.value.details == {
        "limit_seconds": 3.0,
        "value_seconds": 2.0,
        "original_seconds": 2.0,
    }


def test_too_long() -> None:
    with pytest.raises(AudioTooLong) as caught:
        decode_reference(audio_file(31.0), max_bytes=LIMIT)
    assert caught.value.details == {
        "limit_seconds": 30.0,
        "value_seconds": 31.0,
        "original_seconds": 31.0,
    }


def test_much_too_long_stops_decoding_at_the_cap() -> None:
    with pytest.raises(AudioTooLong) as caught:
        decode_reference(
            audio_file(45.0, 16000), max_bytes=LIMIT, max_seconds=10.0, max_silence_seconds=5.0
        )
    # Decoding stopped one second past the limit plus the silence allowance
    # (10 + 5 + 1 s): the value is a lower bound.
    assert caught.value.details == {
        "limit_seconds": 10.0,
        "value_seconds": 16.0,
        "original_seconds": 16.0,
    }
    assert "more than 16 seconds" in caught.value.message


@pytest.mark.parametrize(
    "data",
    [
        np.random.default_rng(7).bytes(50_000),
        b"Hello, this is a text file.\n" * 100,
        b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(2000),
        b"RIFF\x24\x00\x00\x00WAVE",
    ],
    ids=["random-bytes", "text", "png", "bare-riff"],
)
def test_not_audio(data: bytes) -> None:
    with pytest.raises(UnsupportedAudio):
        decode_reference(data, max_bytes=LIMIT)


# --- silence at the ends -------------------------------------------------------


def with_silence(before: float, voice: float, after: float, sample_rate: int = 22050) -> bytes:
    """A WAV of `voice` seconds of tone between digital silences, with faint hiss."""
    rng = np.random.default_rng(3)
    silence = [np.zeros(round(s * sample_rate), dtype=np.float32) for s in (before, after)]
    samples = np.concatenate([silence[0], tone(voice, sample_rate), silence[1]])
    samples += rng.normal(0, 1e-4, len(samples)).astype(np.float32)  # about -80 dBFS
    buffer = io.BytesIO()
    sf.write(buffer, samples, sample_rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def test_silence_at_both_ends_is_trimmed_with_a_small_margin() -> None:
    sample_rate = 22050
    ref = decode_reference(with_silence(1.5, 4.0, 2.0, sample_rate), max_bytes=LIMIT)
    assert ref.original_duration_s == pytest.approx(7.5)
    # 50 ms kept on each side, within one 10 ms frame.
    assert ref.duration_s == pytest.approx(4.1, abs=0.011)
    assert len(ref.samples) == round(ref.duration_s * sample_rate)
    head = ref.samples[: round(0.04 * sample_rate)]
    assert float(np.abs(head).max()) < 1e-3  # the margin is the silence before the voice
    assert float(np.abs(ref.samples).max()) == pytest.approx(0.4, abs=1e-3)


def test_an_untrimmed_recording_reports_the_same_duration_twice() -> None:
    ref = decode_reference(audio_file(5.0), max_bytes=LIMIT)
    assert ref.duration_s == ref.original_duration_s == pytest.approx(5.0)


def test_the_maximum_applies_after_trimming() -> None:
    ref = decode_reference(with_silence(2.0, 29.0, 0.0, 16000), max_bytes=LIMIT)
    assert ref.original_duration_s == pytest.approx(31.0)
    assert ref.duration_s == pytest.approx(29.05, abs=0.011)


def test_the_minimum_applies_after_trimming() -> None:
    with pytest.raises(AudioTooShort) as caught:
        decode_reference(with_silence(0.0, 2.0, 2.0), max_bytes=LIMIT)
    assert caught.value.details["value_seconds"] == pytest.approx(2.05, abs=0.011)
    assert caught.value.details["original_seconds"] == 4.0
    assert "without the silence at its ends" in caught.value.message


def test_silence_beyond_the_allowance_is_refused_as_too_long() -> None:
    data = with_silence(8.0, 5.0, 0.0, 16000)
    with pytest.raises(AudioTooLong) as caught:
        decode_reference(data, max_bytes=LIMIT, max_seconds=10.0, max_silence_seconds=1.0)
    assert caught.value.details["value_seconds"] == 12.0  # decoding stopped at 10 + 1 + 1 s


@pytest.mark.parametrize("noise", [0.0, 1e-4], ids=["digital-zero", "faint-hiss"])
def test_an_all_silent_file_is_refused_as_silent(noise: float) -> None:
    samples = np.random.default_rng(5).normal(0, noise, 5 * 16000).astype(np.float32)
    buffer = io.BytesIO()
    sf.write(buffer, samples, 16000, format="WAV", subtype="FLOAT")
    with pytest.raises(AudioTooShort) as caught:
        decode_reference(buffer.getvalue(), max_bytes=LIMIT)
    assert "silent" in caught.value.message
    assert caught.value.details["value_seconds"] == 0.0
    assert caught.value.details["original_seconds"] == 5.0


def test_a_quiet_recording_is_judged_relative_to_its_own_level() -> None:
    # A voice recorded at low gain (-48 dBFS peak, about -51 dBFS RMS) is still a
    # voice: an absolute -50 dBFS threshold would have called it silence.
    sample_rate = 16000
    quiet = np.concatenate([np.zeros(sample_rate, dtype=np.float32), tone(4.0, sample_rate)])
    buffer = io.BytesIO()
    sf.write(buffer, quiet * 0.01, sample_rate, format="WAV", subtype="FLOAT")
    ref = decode_reference(buffer.getvalue(), max_bytes=LIMIT)
    assert ref.duration_s == pytest.approx(4.05, abs=0.011)


# --- damaged or lying files -----------------------------------------------------


def test_truncated_wav_is_judged_by_what_is_there() -> None:
    sample_rate = 22050
    full = audio_file(10.0, sample_rate)
    kept = len(full) - round(4.0 * sample_rate) * 2  # drop the last 4 s of PCM16
    ref = decode_reference(full[:kept], max_bytes=LIMIT)
    assert ref.duration_s == pytest.approx(6.0, abs=0.01)


def test_truncated_wav_too_short_after_the_cut() -> None:
    full = audio_file(10.0, 16000)
    with pytest.raises((AudioTooShort, UnsupportedAudio)):
        decode_reference(full[: 44 + 16000 * 2], max_bytes=LIMIT)  # 1 s of samples left


@pytest.mark.parametrize("cut", [4, 12, 20, 30, 40])
def test_wav_cut_inside_its_header(cut: int) -> None:
    with pytest.raises(UnsupportedAudio):
        decode_reference(audio_file(10.0)[:cut], max_bytes=LIMIT)


@pytest.mark.parametrize("container", ["FLAC", "OGG"])
def test_truncated_compressed_file_never_crashes(container: str) -> None:
    full = audio_file(10.0, 22050, format=container)
    for fraction in (0.1, 0.5, 0.9):
        try:
            ref = decode_reference(full[: int(len(full) * fraction)], max_bytes=LIMIT)
        except (UnsupportedAudio, AudioTooShort):
            continue
        assert ref.duration_s < 10.0


def test_header_claiming_a_huge_frame_count_is_judged_by_real_samples() -> None:
    claims_an_hour = wav_with_claimed_frames(5.0, 3600 * 16000, 16000)
    ref = decode_reference(claims_an_hour, max_bytes=LIMIT)
    assert ref.duration_s == pytest.approx(5.0, abs=0.01)

    with pytest.raises(AudioTooShort) as caught:
        decode_reference(wav_with_claimed_frames(1.0, 20 * 16000, 16000), max_bytes=LIMIT)
    assert caught.value.details["value_seconds"] == 1.0


# --- output ---------------------------------------------------------------------


def test_encode_wav_round_trip() -> None:
    samples = tone(2.5, 24000)
    data = encode_wav(samples, 24000)
    assert data[:4] == b"RIFF"
    assert audio_duration(data) == pytest.approx(2.5)
    decoded, rate = sf.read(io.BytesIO(data), dtype="float32")
    assert rate == 24000
    assert sf.info(io.BytesIO(data)).subtype == "PCM_16"
    np.testing.assert_allclose(decoded, samples, atol=1 / 32767 + 1e-6)


def test_encode_wav_clips_instead_of_wrapping() -> None:
    data = encode_wav(np.array([2.0, -3.0, 0.5], dtype=np.float32), 16000)
    decoded, _ = sf.read(io.BytesIO(data), dtype="float32")
    np.testing.assert_allclose(decoded, [1.0, -1.0, 0.5], atol=1e-4)


def test_audio_duration_rejects_garbage() -> None:
    with pytest.raises(UnsupportedAudio):
        audio_duration(b"not audio at all")


def test_a_file_that_decodes_to_far_more_audio_than_its_size_holds_is_refused() -> None:
    # A constant signal compresses to almost nothing in FLAC: a decompression bomb's shape.
    samples = np.full((48000 * 10, 2), 0.3, dtype=np.float32)
    buffer = io.BytesIO()
    sf.write(buffer, samples, 48000, format="FLAC")
    data = buffer.getvalue()

    with pytest.raises(AudioInconsistent) as caught:
        decode_reference(data, max_bytes=LIMIT)

    assert caught.value.details["decoded_bytes"] > 300 * len(data)


def test_ordinary_compressed_recordings_are_not_taken_for_bombs() -> None:
    for container, subtype in (("FLAC", None), ("OGG", "VORBIS"), ("MP3", None)):
        decoded = decode_reference(
            audio_file(10.0, 48000, channels=2, format=container, subtype=subtype),
            max_bytes=LIMIT,
        )
        assert decoded.duration_s == pytest.approx(10.0, abs=0.1)
