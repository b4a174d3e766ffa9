"""Output audio: which formats and rates a client may ask for, and encoding them.

Three layers. `check_output` and the tables are pure and cheap: the web tier
calls them to refuse a bad request before a job exists. `encode_output` and
`resample_for_engine` run on workers (libsoxr resamples; no torch anywhere on
this path). `encoder_for` gives the web tier's incremental encoders for a live
stream, built from the same writers as the stored file.

Rate rule: `sample_rate=None` means "the engine's native rate", except for
opus, which uses 48000 Hz. libopus only runs at 8/12/16/24/48 kHz and engines
commonly produce 22050 Hz (espeak), so "native" could not be honoured there.
"""

from __future__ import annotations

import io
import struct
import wave
from dataclasses import dataclass
from typing import Any

import numpy as np
import soundfile as sf
import soxr

from chorus.errors import UnprocessableInput
from synthesis.engines.base import Samples

OUTPUT_FORMATS = ("wav", "flac", "mp3", "opus", "pcm")
OUTPUT_SAMPLE_RATES = (16000, 22050, 24000, 44100, 48000)
# libopus supports only these; of OUTPUT_SAMPLE_RATES that leaves 16/24/48 kHz.
OPUS_SAMPLE_RATES = (16000, 24000, 48000)
OPUS_DEFAULT_SAMPLE_RATE = 48000

CONTENT_TYPES = {
    "wav": "audio/wav",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",  # Ogg-encapsulated (RFC 7845); bare "audio/opus" is for RTP
    # Not audio/L16: RFC 2586 defines L16 as big-endian, and we send s16le.
    # Raw bytes with no header are honestly just octets; the rate travels in the job.
    "pcm": "application/octet-stream",
}
# RFC 7845 recommends ".opus" for Ogg Opus files; ".ogg" suggests Vorbis to players.
FILE_EXTENSIONS = {"wav": "wav", "flac": "flac", "mp3": "mp3", "opus": "opus", "pcm": "pcm"}

# (container, subtype) for soundfile; pcm is written by hand (no header).
_SOUNDFILE_FORMATS = {
    "wav": ("WAV", "PCM_16"),
    "flac": ("FLAC", "PCM_16"),
    "mp3": ("MP3", "MPEG_LAYER_III"),
    "opus": ("OGG", "OPUS"),
}

# -1 dBFS: headroom for lossy codecs, whose decoded waveform overshoots the input peak.
TARGET_PEAK = 0.89
# Below -60 dBFS there is nothing to hear; raising it to TARGET_PEAK would only
# amplify noise by 60 dB or more, so such output is left as it is.
SILENCE_PEAK = 1e-3
# An abrupt start or end is a click in any format, and Ogg Opus decodes a hard
# cut at full level to more than twice full scale; a 5 ms fade removes both.
FADE_S = 0.005
# libsndfile does not flush libopus's 6.5 ms lookahead at the end of a stream:
# the last few ms decode as loud garbage (up to 1.5x full scale in tests). Ending
# on 10 ms of silence puts that garbage in silence, where it stays near zero.
OPUS_TAIL_S = 0.010


class UnsupportedOutput(UnprocessableInput):
    code = "unsupported_output"


@dataclass(frozen=True)
class EncodedAudio:
    data: bytes
    sample_rate: int
    duration_s: float
    content_type: str
    extension: str  # without the dot


def allowed_sample_rates(format: str) -> tuple[int, ...]:
    return OPUS_SAMPLE_RATES if format == "opus" else OUTPUT_SAMPLE_RATES


def check_output(format: str, sample_rate: int | None) -> int | None:
    """The rate to encode at (None: the engine's native rate), or raise UnsupportedOutput."""
    if format not in OUTPUT_FORMATS:
        raise UnsupportedOutput(
            f"the output format '{format}' is not supported; use one of "
            + ", ".join(OUTPUT_FORMATS),
            details=_details(format, sample_rate),
        )
    if sample_rate is None:
        return OPUS_DEFAULT_SAMPLE_RATE if format == "opus" else None
    allowed = allowed_sample_rates(format)
    if sample_rate not in allowed:
        raise UnsupportedOutput(
            f"{format} output at {sample_rate} Hz is not supported; use one of "
            + ", ".join(f"{rate} Hz" for rate in allowed),
            details=_details(format, sample_rate),
        )
    return sample_rate


def _details(format: str, sample_rate: int | None) -> dict[str, object]:
    return {
        "format": format,
        "sample_rate": sample_rate,
        "allowed_formats": list(OUTPUT_FORMATS),
        "allowed_sample_rates": list(allowed_sample_rates(format)),
    }


# --- worker side (resampling, encoding) ------------------------------------------


def encode_output(
    samples: Samples, source_rate: int, *, format: str, sample_rate: int | None
) -> EncodedAudio:
    """Resample, fade the ends, peak-normalize and encode mono float32 engine output."""
    # Checked again here: a job may have been queued by an older web tier.
    target_rate = check_output(format, sample_rate) or source_rate
    mono = _sanitize(samples)
    if target_rate != source_rate:
        mono = resample_for_engine(mono, source_rate, target_rate)
    # After resampling: the resampler's ringing can raise the peak.
    mono = normalize_peak(_fade_ends(mono, target_rate))
    if format == "opus":
        mono = np.concatenate([mono, np.zeros(round(OPUS_TAIL_S * target_rate), np.float32)])
    return EncodedAudio(
        data=_encode(mono, target_rate, format),
        sample_rate=target_rate,
        duration_s=len(mono) / target_rate,
        content_type=CONTENT_TYPES[format],
        extension=FILE_EXTENSIONS[format],
    )


def warm_up_output(source_rate: int) -> None:
    """Encode a moment of silence in every format and rate once, at worker start:
    the first job then finds the encoders (libsndfile's mp3/opus/flac, libsoxr's
    filters) initialised, and is as fast as the next ones."""
    silence = np.zeros(source_rate // 10, dtype=np.float32)
    for format in OUTPUT_FORMATS:
        for rate in allowed_sample_rates(format):
            encode_output(silence, source_rate, format=format, sample_rate=rate)


def resample_for_engine(samples: Samples, rate: int, target_rate: int) -> Samples:
    """Mono float32 `samples` at `rate` resampled to `target_rate` (band-limited sinc)."""
    mono = np.ascontiguousarray(np.asarray(samples, dtype=np.float32).reshape(-1))
    if rate == target_rate or len(mono) == 0:
        return mono
    # libsoxr at its very-high quality: band-limited, linear phase, ~175 dB stop band.
    # A C library of a few hundred kilobytes, loaded in milliseconds: a worker
    # needs no torch to resample, so its first job is as fast as its tenth.
    out = soxr.resample(mono, rate, target_rate, quality="VHQ")
    return np.ascontiguousarray(out, dtype=np.float32)


def normalize_peak(samples: Samples) -> Samples:
    """Scale so the peak is TARGET_PEAK (-1 dBFS), up or down; never clips.

    Peak rather than loudness normalization: a single gain that cannot push any
    sample past full scale, so no limiter is needed. Silence is left alone.
    """
    peak = float(np.max(np.abs(samples))) if len(samples) else 0.0
    if peak < SILENCE_PEAK:
        return samples
    return (samples * np.float32(TARGET_PEAK / peak)).astype(np.float32)


def _fade_ends(samples: Samples, sample_rate: int) -> Samples:
    """A copy with half-cosine fades over the first and last FADE_S seconds."""
    faded = samples.copy()
    length = min(round(FADE_S * sample_rate), len(faded) // 2)
    if length == 0:
        return faded
    ramp = (0.5 - 0.5 * np.cos(np.pi * np.arange(length) / length)).astype(np.float32)
    faded[:length] *= ramp
    faded[-length:] *= ramp[::-1]
    return faded


def _sanitize(samples: Samples) -> Samples:
    mono = np.asarray(samples, dtype=np.float32).reshape(-1)
    # One NaN would make the peak NaN and every normalized sample with it.
    return np.nan_to_num(mono, nan=0.0, posinf=0.0, neginf=0.0)


def _encode(samples: Samples, sample_rate: int, format: str) -> bytes:
    # Normalization already keeps |x| <= TARGET_PEAK; the clip is a cheap guarantee
    # that the int16 conversion below can never wrap around.
    clipped = np.clip(samples, -1.0, 1.0)
    if format == "pcm":
        return to_s16le(clipped)
    if format == "wav":
        return _wav_pcm16(clipped, sample_rate)
    container, subtype = _SOUNDFILE_FORMATS[format]
    buffer = io.BytesIO()
    sf.write(buffer, clipped, sample_rate, format=container, subtype=subtype)
    return buffer.getvalue()


def _wav_pcm16(samples: Samples, sample_rate: int) -> bytes:
    """16-bit mono WAV, byte for byte what libsndfile writes (its conversion: x
    times 32768, floored, clipped to int16; its 44-byte header). libsndfile
    writes to memory through a Python callback per block, which cost a job
    about a millisecond of CPU; the standard library's writer takes a tenth."""
    pcm = np.clip(np.floor(samples * np.float32(32768)), -32768, 32767).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(pcm.tobytes())
    return buffer.getvalue()


def to_s16le(samples: Samples) -> bytes:
    """Mono s16le, as the pcm format and a live stream carry samples: NaN is
    silence, and samples past full scale are clipped, never wrapped."""
    clipped = np.clip(np.nan_to_num(np.asarray(samples, dtype=np.float32)), -1.0, 1.0)
    return np.round(clipped * 32767).astype("<i2").tobytes()


# --- live streams (web tier): s16le chunks in, body bytes out --------------------


def wav_stream_header(sample_rate: int) -> bytes:
    """The header of `_wav_pcm16` for a stream of unknown length: the RIFF and
    data sizes are 0xFFFFFFFF, which players and decoders read as 'until the end'."""
    header = bytearray(_wav_pcm16(np.zeros(0, dtype=np.float32), sample_rate))
    header[4:8] = header[40:44] = struct.pack("<I", 0xFFFFFFFF)
    return bytes(header)


class PcmEncoder:
    def __init__(self, sample_rate: int, *, wav: bool) -> None:
        self.header = wav_stream_header(sample_rate) if wav else b""

    def feed(self, pcm: bytes) -> bytes:
        out, self.header = self.header + pcm, b""
        return out

    def close(self) -> bytes:
        return self.header


class _AppendOnly(io.RawIOBase):
    """A write-only file for libsndfile whose new bytes can be drained as they come."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.position = 0
        self.drained = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        data = bytes(b)
        end = self.position + len(data)
        if end > len(self.data):
            self.data.extend(bytes(end - len(self.data)))
        self.data[self.position : end] = data
        self.position = end
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.position, 2: len(self.data)}[whence]
        self.position = base + offset
        return self.position

    def tell(self) -> int:
        return self.position

    def read(self, size: int = -1) -> bytes:
        return b""

    def drain(self) -> bytes:
        new = bytes(self.data[self.drained :])
        self.drained = len(self.data)
        return new


class OpusEncoder:
    """Ogg Opus written as it goes, as the stored file is: Ogg never rewrites what
    it has written. (mp3 and flac cannot be streamed this way: libsndfile rewrites
    their headers when the file closes.)"""

    def __init__(self, sample_rate: int) -> None:
        container, subtype = _SOUNDFILE_FORMATS["opus"]
        self.out = _AppendOnly()
        self.file = sf.SoundFile(
            self.out, "w", samplerate=sample_rate, channels=1, format=container, subtype=subtype
        )

    def feed(self, pcm: bytes) -> bytes:
        self.file.write(np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0)
        return self.out.drain()

    def close(self) -> bytes:
        self.file.close()
        return self.out.drain()


StreamEncoder = PcmEncoder | OpusEncoder


def encoder_for(format: str, sample_rate: int) -> StreamEncoder | None:
    """An incremental encoder, or None where the stored file must be sent instead."""
    if format in ("wav", "pcm"):
        return PcmEncoder(sample_rate, wav=format == "wav")
    if format == "opus" and sample_rate in OPUS_SAMPLE_RATES:
        return OpusEncoder(sample_rate)
    return None
