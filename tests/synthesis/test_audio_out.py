"""Output audio: request checks, and every format decoded back with soundfile."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from chorus.errors import UnprocessableInput
from synthesis import audio_out
from synthesis.audio_out import (
    CONTENT_TYPES,
    FILE_EXTENSIONS,
    OPUS_SAMPLE_RATES,
    OUTPUT_FORMATS,
    OUTPUT_SAMPLE_RATES,
    TARGET_PEAK,
    UnsupportedOutput,
    allowed_sample_rates,
    check_output,
    encode_output,
    normalize_peak,
    resample_for_engine,
)
from tests.audio_files import tone

REPO_ROOT = Path(__file__).resolve().parents[2]

ALL_COMBINATIONS = [
    (format, rate) for format in OUTPUT_FORMATS for rate in allowed_sample_rates(format)
]


def decode(data: bytes, format: str, sample_rate: int) -> tuple[np.ndarray, int]:
    if format == "pcm":
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32767, sample_rate
    samples, rate = sf.read(io.BytesIO(data), dtype="float32")
    return samples, rate


def dominant_hz(samples: np.ndarray, sample_rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.fft.rfftfreq(len(samples), 1 / sample_rate)[int(np.argmax(spectrum))])


# --- check_output -----------------------------------------------------------------


@pytest.mark.parametrize(("format", "rate"), ALL_COMBINATIONS)
def test_every_allowed_combination_passes_with_its_rate(format: str, rate: int) -> None:
    assert check_output(format, rate) == rate


def test_no_rate_means_native_except_for_opus_which_uses_48k() -> None:
    for format in ("wav", "flac", "mp3", "pcm"):
        assert check_output(format, None) is None
    assert check_output("opus", None) == 48000


@pytest.mark.parametrize("rate", [22050, 44100])
def test_opus_refuses_rates_libopus_cannot_run_at(rate: int) -> None:
    with pytest.raises(UnsupportedOutput) as caught:
        check_output("opus", rate)
    error = caught.value
    assert isinstance(error, UnprocessableInput)
    assert (error.status, error.code) == (422, "unsupported_output")
    assert error.details["allowed_sample_rates"] == [16000, 24000, 48000]
    assert error.details["allowed_formats"] == list(OUTPUT_FORMATS)
    assert "16000 Hz, 24000 Hz, 48000 Hz" in error.message


@pytest.mark.parametrize("format", ["ogg", "WAV", "aac", ""])
def test_unknown_formats_are_refused(format: str) -> None:
    with pytest.raises(UnsupportedOutput) as caught:
        check_output(format, 24000)
    assert caught.value.code == "unsupported_output"
    assert caught.value.details["format"] == format
    assert caught.value.details["allowed_sample_rates"] == list(OUTPUT_SAMPLE_RATES)


@pytest.mark.parametrize("rate", [8000, 32000, 96000, 0])
def test_rates_outside_the_list_are_refused(rate: int) -> None:
    with pytest.raises(UnsupportedOutput):
        check_output("wav", rate)


def test_tables_cover_every_format() -> None:
    assert set(CONTENT_TYPES) == set(FILE_EXTENSIONS) == set(OUTPUT_FORMATS)
    assert set(OPUS_SAMPLE_RATES) <= set(OUTPUT_SAMPLE_RATES)
    assert FILE_EXTENSIONS["opus"] == "opus"
    assert CONTENT_TYPES["opus"] == "audio/ogg"


def test_checking_and_encoding_output_never_import_torch() -> None:
    # Neither the web tier nor a worker on the default engines needs torch: the
    # install stays small and a worker's first resampling job is not slowed by it.
    script = (
        "import sys\n"
        "import numpy as np\n"
        "sys.modules['torch'] = None\n"  # any `import torch` now raises ImportError
        "sys.modules['torchaudio'] = None\n"
        "from synthesis.audio_out import check_output, encode_output, UnsupportedOutput\n"
        "assert check_output('opus', None) == 48000\n"
        "tone = np.sin(np.arange(22050, dtype=np.float32) / 10)\n"
        "assert encode_output(tone, 22050, format='wav', sample_rate=48000).sample_rate == 48000\n"
        "try:\n"
        "    check_output('opus', 22050)\n"
        "except UnsupportedOutput as exc:\n"
        "    print(exc.code)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "unsupported_output"


# --- encode_output ----------------------------------------------------------------


@pytest.mark.parametrize("source_rate", [24000, 22050])
@pytest.mark.parametrize(("format", "rate"), ALL_COMBINATIONS)
def test_every_format_and_rate_decodes_back_to_the_same_duration(
    format: str, rate: int, source_rate: int
) -> None:
    encoded = encode_output(tone(3.0, source_rate), source_rate, format=format, sample_rate=rate)

    samples, decoded_rate = decode(encoded.data, format, rate)

    assert decoded_rate == encoded.sample_rate == rate
    assert encoded.duration_s == pytest.approx(3.0, rel=0.01)
    assert len(samples) / decoded_rate == pytest.approx(3.0, rel=0.01)
    assert encoded.content_type == CONTENT_TYPES[format]
    assert encoded.extension == FILE_EXTENSIONS[format]
    assert 0.5 < float(np.abs(samples).max()) <= 1.0


@pytest.mark.parametrize("format", ["wav", "flac", "mp3", "pcm"])
def test_no_rate_keeps_the_engine_rate(format: str) -> None:
    encoded = encode_output(tone(1.0, 22050), 22050, format=format, sample_rate=None)
    assert encoded.sample_rate == 22050


def test_opus_without_a_rate_is_encoded_at_48k_from_a_22050_engine() -> None:
    encoded = encode_output(tone(2.0, 22050), 22050, format="opus", sample_rate=None)
    samples, rate = sf.read(io.BytesIO(encoded.data), dtype="float32")
    assert encoded.sample_rate == rate == 48000
    assert len(samples) / rate == pytest.approx(2.0, rel=0.01)


def test_encode_output_refuses_what_check_output_refuses() -> None:
    with pytest.raises(UnsupportedOutput):
        encode_output(tone(1.0, 22050), 22050, format="opus", sample_rate=44100)


def test_pcm_is_raw_little_endian_int16_without_a_header() -> None:
    samples = tone(1.0, 16000)
    encoded = encode_output(samples, 16000, format="pcm", sample_rate=16000)
    assert len(encoded.data) == 2 * len(samples)
    # Peak-normalized to TARGET_PEAK, then scaled to int16; the ends are faded.
    expected = np.round(samples / 0.4 * TARGET_PEAK * 32767).astype("<i2")
    middle = slice(100, -100)
    decoded = np.frombuffer(encoded.data, dtype="<i2")
    np.testing.assert_allclose(decoded[middle], expected[middle], atol=1)


def test_the_ends_are_faded_so_a_hard_cut_does_not_click() -> None:
    # Through libsndfile, Ogg Opus turns a hard cut at full level into garbage far
    # past full scale; the fade and the silent tail keep it inside.
    square = np.full(24000, 0.9, dtype=np.float32)
    encoded = encode_output(square, 24000, format="opus", sample_rate=24000)
    samples, _ = sf.read(io.BytesIO(encoded.data), dtype="float32")
    assert float(np.abs(samples).max()) <= 1.0
    pcm = encode_output(square, 24000, format="pcm", sample_rate=24000).data
    decoded = np.frombuffer(pcm, dtype="<i2")
    assert decoded[0] == decoded[-1] == 0
    assert decoded[len(decoded) // 2] == round(TARGET_PEAK * 32767)


@pytest.mark.parametrize("rate", OUTPUT_SAMPLE_RATES)
def test_wav_is_byte_for_byte_what_libsndfile_writes(rate: int) -> None:
    rng = np.random.default_rng(rate)
    samples = np.clip(rng.standard_normal(rate // 2) * 0.6, -1, 1).astype(np.float32)
    # Full scale both ways, and values half a step either side of zero and one.
    samples[:5] = [1.0, -1.0, 0.5 / 32768, 1.5 / 32768, -0.5 / 32768]
    written = io.BytesIO()
    sf.write(written, samples, rate, format="WAV", subtype="PCM_16")

    assert audio_out._encode(samples, rate, "wav") == written.getvalue()


def test_wav_and_flac_are_16_bit() -> None:
    for format, container in (("wav", "WAV"), ("flac", "FLAC")):
        info = sf.info(
            io.BytesIO(
                encode_output(tone(1.0, 24000), 24000, format=format, sample_rate=24000).data
            )
        )
        assert (info.format, info.subtype) == (container, "PCM_16")


# --- normalization ----------------------------------------------------------------


@pytest.mark.parametrize("format", ["wav", "pcm", "flac"])
def test_loud_input_is_attenuated_never_clipped(format: str) -> None:
    loud = tone(1.0, 24000) / 0.4 * 3.0  # peak 3.0
    encoded = encode_output(loud, 24000, format=format, sample_rate=24000)
    samples, _ = decode(encoded.data, format, 24000)
    peak = float(np.abs(samples).max())
    assert 0.8 < peak <= 1.0
    assert peak == pytest.approx(TARGET_PEAK, abs=1e-3)
    # The same sine, only scaled (a clipped one would have flat tops); the ends are faded.
    middle = slice(200, -200)
    np.testing.assert_allclose(samples[middle], loud[middle] * TARGET_PEAK / 3.0, atol=1e-3)


def test_resampling_overshoot_does_not_clip() -> None:
    # A full-scale square wave rings past +/-1 when resampled; normalizing after
    # resampling must absorb it.
    square = np.sign(np.sin(2 * np.pi * 300 * np.arange(24000) / 24000)).astype(np.float32)
    encoded = encode_output(square, 24000, format="pcm", sample_rate=44100)
    peak = float(np.abs(np.frombuffer(encoded.data, dtype="<i2")).max()) / 32767
    assert peak == pytest.approx(TARGET_PEAK, abs=1e-3)


def test_quiet_input_is_raised_to_the_target_peak() -> None:
    quiet = tone(1.0, 24000) * 0.05  # peak 0.02, about -34 dBFS
    normalized = normalize_peak(quiet)
    assert float(np.abs(normalized).max()) == pytest.approx(TARGET_PEAK, rel=1e-5)
    samples, _ = decode(encode_output(quiet, 24000, format="wav", sample_rate=24000).data, "wav", 0)
    assert float(np.abs(samples).max()) == pytest.approx(TARGET_PEAK, abs=1e-3)


@pytest.mark.parametrize("level", [0.0, 1e-5])
def test_silence_stays_silence(level: float) -> None:
    silence = np.full(24000, level, dtype=np.float32)
    encoded = encode_output(silence, 24000, format="pcm", sample_rate=24000)
    assert np.abs(np.frombuffer(encoded.data, dtype="<i2")).max() <= 1


def test_nan_samples_do_not_poison_the_output() -> None:
    samples = tone(1.0, 24000)
    samples[100] = np.nan
    encoded = encode_output(samples, 24000, format="pcm", sample_rate=24000)
    peak = float(np.abs(np.frombuffer(encoded.data, dtype="<i2")).max()) / 32767
    assert peak == pytest.approx(TARGET_PEAK, abs=1e-3)


def test_empty_input_encodes_to_empty_audio() -> None:
    encoded = encode_output(np.zeros(0, dtype=np.float32), 22050, format="wav", sample_rate=48000)
    assert encoded.duration_s == 0.0
    assert sf.info(io.BytesIO(encoded.data)).frames == 0


# --- resampling -------------------------------------------------------------------


@pytest.mark.parametrize(("source", "target"), [(22050, 48000), (24000, 16000), (44100, 24000)])
def test_resampling_keeps_a_440_hz_tone_at_440_hz(source: int, target: int) -> None:
    resampled = resample_for_engine(tone(2.0, source, hz=440.0), source, target)
    assert resampled.dtype == np.float32
    assert len(resampled) == pytest.approx(2.0 * target, abs=2)
    assert dominant_hz(resampled, target) == pytest.approx(440.0, abs=1.0)


def test_encoded_output_keeps_the_tone_frequency() -> None:
    encoded = encode_output(tone(2.0, 22050, hz=440.0), 22050, format="flac", sample_rate=44100)
    samples, rate = sf.read(io.BytesIO(encoded.data), dtype="float32")
    assert dominant_hz(samples, rate) == pytest.approx(440.0, abs=1.0)


def test_downsampling_removes_what_the_new_rate_cannot_hold() -> None:
    # A 10 kHz tone cannot exist at 16 kHz (Nyquist 8 kHz): a resampler without
    # an anti-aliasing filter would fold it down to an audible 6 kHz.
    resampled = resample_for_engine(tone(1.0, 44100, hz=10000.0), 44100, 16000)
    assert float(np.max(np.abs(resampled[1000:-1000]))) < 1e-3


def test_resampling_to_the_same_rate_is_a_no_op() -> None:
    samples = tone(0.5, 16000)
    np.testing.assert_array_equal(resample_for_engine(samples, 16000, 16000), samples)


def test_the_worker_warm_up_encodes_every_format_at_every_rate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    done: list[tuple[str, int | None]] = []
    real = audio_out.encode_output

    def counting(samples: Any, rate: int, *, format: str, sample_rate: int | None) -> Any:
        done.append((format, sample_rate))
        return real(samples, rate, format=format, sample_rate=sample_rate)

    monkeypatch.setattr(audio_out, "encode_output", counting)
    audio_out.warm_up_output(22050)

    assert set(done) == set(ALL_COMBINATIONS)


# --- live streams: the same writers as the stored file ------------------------------


@pytest.mark.parametrize("rate", OUTPUT_SAMPLE_RATES)
def test_a_streamed_wav_has_the_stored_files_header_with_its_length_left_open(rate: int) -> None:
    stored = encode_output(np.zeros(100, np.float32), rate, format="wav", sample_rate=None).data
    header = audio_out.wav_stream_header(rate)
    unknown = b"\xff\xff\xff\xff"
    assert header == stored[:4] + unknown + stored[8:40] + unknown


def test_streamed_pcm_is_what_the_stored_pcm_file_holds() -> None:
    samples = np.linspace(-0.8, 0.8, 2400, dtype=np.float32)
    stored = encode_output(samples, 24000, format="pcm", sample_rate=None).data
    encoder = audio_out.encoder_for("pcm", 24000)
    assert encoder is not None
    streamed = encoder.feed(
        audio_out.to_s16le(audio_out.normalize_peak(audio_out._fade_ends(samples, 24000)))
    )
    assert streamed + encoder.close() == stored


def test_only_formats_libsndfile_can_append_to_are_encoded_as_they_go() -> None:
    assert isinstance(audio_out.encoder_for("opus", 48000), audio_out.OpusEncoder)
    assert audio_out.encoder_for("opus", 22050) is None  # not a libopus rate
    assert audio_out.encoder_for("mp3", 24000) is None
    assert audio_out.encoder_for("flac", 24000) is None
