"""Reference-audio validation and output encoding (no Django, no torch).

Uploads are judged only by decoding them: a file name or content type says
nothing about what the bytes are. Durations come from the samples actually
decoded, never from a header's frame count, which a truncated or crafted file
can misstate.

Silence at either end is trimmed before the duration rule applies: the limits
are about how much voice a recording holds, and a user should not be refused
for a pause before speaking or after stopping the recorder.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
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
from synthesis.engines.base import ReferenceAudio, Samples

# Containers we accept. libsndfile parses many exotic formats; nobody records a
# voice reference in them, and each extra parser is attack surface for uploads.
ACCEPTED_FORMATS = frozenset({"WAV", "WAVEX", "RF64", "W64", "FLAC", "OGG", "MP3", "AIFF", "CAF"})
# Above any real recording rate; bounds the decode buffer a crafted header can ask for.
MAX_SAMPLE_RATE = 384000
_BLOCK_FRAMES = 65536

# Silence is judged per 10 ms frame, relative to the loudest frame: uploads come
# at any gain, so an absolute threshold would cut soft speech from a quiet
# recording and keep the hiss of a hot one. 45 dB below the loudest frame sits
# under the quietest consonants of normal speech yet above the noise floor of
# a decent recording; in a noisier one nothing is trimmed, the safe direction.
SILENCE_BELOW_PEAK_DB = 45.0
# Nothing louder than this anywhere means there is no voice to clone at all.
SILENCE_FLOOR_DBFS = -60.0
_TRIM_FRAME_S = 0.010
# Kept on each side of the voice so soft onsets and decays are not clipped off.
_TRIM_MARGIN_S = 0.050


@dataclass(frozen=True)
class DecodedReference:
    samples: Samples  # mono float32 in [-1, 1]; multi-channel input is averaged
    sample_rate: int
    channels: int  # of the upload, before mixing down
    duration_s: float  # after trimming silence at either end; what the limits apply to
    original_duration_s: float  # of the whole upload, silence included
    format: str  # libsndfile's container name: "WAV", "FLAC", "OGG", "MP3", ...

    def to_reference(self, *, transcript: str = "", language: str = "") -> ReferenceAudio:
        return ReferenceAudio(
            samples=self.samples,
            sample_rate=self.sample_rate,
            transcript=transcript,
            language=language,
        )


def decode_reference(
    data: bytes,
    *,
    max_bytes: int,
    min_seconds: float = 3.0,
    max_seconds: float = 30.0,
    min_sample_rate: int = 16000,
    max_channels: int = 2,
    max_silence_seconds: float = 30.0,
) -> DecodedReference:
    """Decode and validate an uploaded voice reference, or raise the matching ChorusError.

    The duration limits apply after silence at either end is trimmed; up to
    `max_silence_seconds` of such silence is decoded on top of `max_seconds`.
    """
    if len(data) == 0:
        raise EmptyFile("the uploaded file is empty")
    if len(data) > max_bytes:
        raise FileTooLarge(
            f"the file is {len(data)} bytes; the limit is {max_bytes} bytes",
            details={"limit_bytes": max_bytes, "size_bytes": len(data)},
        )
    with _open(data) as audio:
        channels, sample_rate, container = audio.channels, audio.samplerate, audio.format
        _check_stream(container, channels, sample_rate, min_sample_rate, max_channels)
        # One second of slack over the limits tells "too long" apart from "at the
        # limit" while bounding memory whatever the header claims.
        cap_seconds = max_seconds + max_silence_seconds + 1
        mono, more = _read_mono(audio, int(cap_seconds * sample_rate))

    original = len(mono) / sample_rate
    _check_expansion(len(data), len(mono), channels, more)
    if more:
        raise AudioTooLong(
            f"the file holds more than {cap_seconds:g} seconds of audio; at most "
            f"{max_seconds:g} seconds are accepted, plus up to {max_silence_seconds:g} "
            "seconds of silence at its ends",
            details=_duration_details(max_seconds, original, original),
        )
    voice = _voice_span(mono, sample_rate)
    if voice is None:
        raise AudioTooShort(
            f"the audio is silent: nothing in it is louder than {SILENCE_FLOOR_DBFS:g} dBFS",
            details=_duration_details(min_seconds, 0.0, original),
        )
    trimmed = mono[voice]
    duration = len(trimmed) / sample_rate
    _check_duration(duration, original, min_seconds, max_seconds)
    return DecodedReference(
        samples=np.ascontiguousarray(trimmed, dtype=np.float32),
        sample_rate=sample_rate,
        channels=channels,
        duration_s=duration,
        original_duration_s=original,
        format=container,
    )


# No codec we accept squeezes real recordings past this many times their size in
# 16-bit PCM (Ogg Opus at its lowest bitrate, stereo 48 kHz, is about 250x); a
# file that decodes to more is crafted to (a decompression bomb) and is refused.
MAX_EXPANSION = 300


def _check_expansion(size: int, frames: int, channels: int, more: bool) -> None:
    pcm_bytes = frames * channels * 2
    if more or pcm_bytes <= size * MAX_EXPANSION:
        return  # `more` means it is refused as too long anyway
    raise AudioInconsistent(
        f"the file is {size} bytes but decodes to {pcm_bytes} bytes of audio, far more than "
        "any recording of that size holds",
        details={"size_bytes": size, "decoded_bytes": pcm_bytes, "max_ratio": MAX_EXPANSION},
    )


def _check_stream(
    container: str, channels: int, sample_rate: int, min_sample_rate: int, max_channels: int
) -> None:
    if container not in ACCEPTED_FORMATS:
        raise UnsupportedAudio(
            f"{container} audio is not accepted; use WAV, FLAC, OGG or MP3",
            details={"format": container},
        )
    if channels > max_channels:
        raise TooManyChannels(
            f"the audio has {channels} channels; at most {max_channels} are accepted",
            details={"limit": max_channels, "value": channels},
        )
    if sample_rate < min_sample_rate:
        raise SampleRateTooLow(
            f"the sample rate is {sample_rate} Hz; at least {min_sample_rate} Hz is required",
            details={"limit": min_sample_rate, "value": sample_rate},
        )
    if sample_rate > MAX_SAMPLE_RATE:
        raise UnsupportedAudio(
            f"a sample rate of {sample_rate} Hz is not supported",
            details={"sample_rate": sample_rate},
        )


def _check_duration(
    duration: float, original: float, min_seconds: float, max_seconds: float
) -> None:
    # Say so when trimming changed the length, or the number looks wrong to the user.
    note = "" if duration == original else f" without the silence at its ends ({original:.2f} s)"
    if duration > max_seconds:
        raise AudioTooLong(
            f"the audio is {duration:.2f} seconds{note}; at most {max_seconds:g} are accepted",
            details=_duration_details(max_seconds, duration, original),
        )
    if duration < min_seconds:
        raise AudioTooShort(
            f"the audio is {duration:.2f} seconds{note}; "
            f"at least {min_seconds:g} seconds are required",
            details=_duration_details(min_seconds, duration, original),
        )


def _duration_details(limit: float, value: float, original: float) -> dict[str, float]:
    return {
        "limit_seconds": limit,
        "value_seconds": round(value, 2),
        "original_seconds": round(original, 2),
    }


def _voice_span(mono: Samples, sample_rate: int) -> slice | None:
    """The samples from the first to the last non-silent frame, plus a margin.

    None when the whole recording is silent; an empty recording is an empty span.
    """
    if len(mono) == 0:
        return slice(0, 0)
    frame = max(1, round(_TRIM_FRAME_S * sample_rate))
    power = _frame_power(mono, frame)
    loudest = float(power.max())
    # Compared as mean squares (power), so dB steps are tenths, not twentieths.
    floor = 10 ** (SILENCE_FLOOR_DBFS / 10)
    if loudest < floor:
        return None
    threshold = max(loudest * 10 ** (-SILENCE_BELOW_PEAK_DB / 10), floor)
    loud = np.flatnonzero(power >= threshold)
    margin = round(_TRIM_MARGIN_S * sample_rate)
    start = max(0, int(loud[0]) * frame - margin)
    end = min(len(mono), (int(loud[-1]) + 1) * frame + margin)
    return slice(start, end)


def _frame_power(mono: Samples, frame: int) -> np.ndarray:
    """Mean square of each `frame`-sample frame; a shorter last frame counts too."""
    full = len(mono) // frame
    blocks = mono[: full * frame].reshape(full, frame)
    # einsum sums the squares row by row without a squared copy of the whole file.
    power = np.einsum("ij,ij->i", blocks, blocks) / frame
    tail = mono[full * frame :]
    if len(tail):
        power = np.append(power, float(np.dot(tail, tail)) / len(tail))
    return power


def encode_wav(samples: Samples, sample_rate: int) -> bytes:
    """16-bit PCM mono WAV; samples outside [-1, 1] are clipped, not wrapped."""
    clipped = np.clip(np.asarray(samples, dtype=np.float32).reshape(-1), -1.0, 1.0)
    buffer = io.BytesIO()
    sf.write(buffer, clipped, sample_rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def audio_duration(data: bytes) -> float:
    """Seconds of audio in `data`, counted from the decoded samples."""
    with _open(data) as audio:
        total = 0
        try:
            for block in audio.blocks(blocksize=_BLOCK_FRAMES, dtype="float32", always_2d=True):
                total += len(block)
        except Exception as exc:
            raise _unsupported(exc) from exc
        return total / audio.samplerate


@contextmanager
def _open(data: bytes) -> Iterator[sf.SoundFile]:
    """`sf.SoundFile` over bytes, with any failure to open it as UnsupportedAudio."""
    try:
        audio = sf.SoundFile(io.BytesIO(data))
    except Exception as exc:  # soundfile raises several types for bad input
        raise _unsupported(exc) from exc
    with audio:
        yield audio


def _read_mono(audio: sf.SoundFile, cap: int) -> tuple[Samples, bool]:
    """Up to `cap` frames mixed down to mono, and whether more audio follows.

    Mixing block by block keeps one float32 value per frame in memory, not one
    per channel.
    """
    blocks: list[Samples] = []
    count = 0
    try:
        while count < cap:
            block = audio.read(min(_BLOCK_FRAMES, cap - count), dtype="float32", always_2d=True)
            if len(block) == 0:
                break
            blocks.append(
                block.mean(axis=1, dtype=np.float32) if block.shape[1] > 1 else block[:, 0]
            )
            count += len(block)
        more = count >= cap and len(audio.read(1, dtype="float32", always_2d=True)) > 0
    except Exception as exc:  # corrupt or truncated data mid-stream
        raise _unsupported(exc) from exc
    if not blocks:
        return np.zeros(0, dtype=np.float32), False
    return np.concatenate(blocks), more


def _unsupported(exc: Exception) -> UnsupportedAudio:
    return UnsupportedAudio(
        "the file could not be decoded as audio (WAV, FLAC, OGG or MP3)",
        details={"reason": str(exc)[:200]},
    )
