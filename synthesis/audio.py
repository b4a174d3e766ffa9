"""Reference-audio validation and output encoding (no Django, no torch).

Uploads are judged only by decoding them: a file name or content type says
nothing about what the bytes are. Durations come from the samples actually
decoded, never from a header's frame count, which a truncated or crafted file
can misstate.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import soundfile as sf

from chorus.errors import (
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


@dataclass(frozen=True)
class DecodedReference:
    samples: Samples  # mono float32 in [-1, 1]; multi-channel input is averaged
    sample_rate: int
    channels: int  # of the upload, before mixing down
    duration_s: float
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
) -> DecodedReference:
    """Decode and validate an uploaded voice reference, or raise the matching ChorusError."""
    if len(data) == 0:
        raise EmptyFile("the uploaded file is empty")
    if len(data) > max_bytes:
        raise FileTooLarge(
            f"the file is {len(data)} bytes; the limit is {max_bytes} bytes",
            details={"limit_bytes": max_bytes, "size_bytes": len(data)},
        )
    with _open(data) as audio:
        channels, sample_rate, container = audio.channels, audio.samplerate, audio.format
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
        # One second of slack over the limit tells "too long" apart from "at the limit"
        # while bounding memory whatever the header claims.
        cap = int((max_seconds + 1) * sample_rate)
        frames, more = _read_frames(audio, cap)

    duration = len(frames) / sample_rate
    if more or duration > max_seconds:
        # When decoding stopped at the cap, the value is a lower bound.
        at_least = "at least " if more else ""
        raise AudioTooLong(
            f"the audio is {at_least}{duration:.2f} seconds; at most {max_seconds:g} are accepted",
            details={"limit_seconds": max_seconds, "value_seconds": round(duration, 2)},
        )
    if duration < min_seconds:
        raise AudioTooShort(
            f"the audio is {duration:.2f} seconds; at least {min_seconds:g} seconds are required",
            details={"limit_seconds": min_seconds, "value_seconds": round(duration, 2)},
        )
    mono = frames.mean(axis=1, dtype=np.float32) if channels > 1 else frames[:, 0]
    return DecodedReference(
        samples=np.ascontiguousarray(mono, dtype=np.float32),
        sample_rate=sample_rate,
        channels=channels,
        duration_s=duration,
        format=container,
    )


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


def _read_frames(audio: sf.SoundFile, cap: int) -> tuple[np.ndarray, bool]:
    """Up to `cap` frames (frames x channels) and whether more audio follows."""
    blocks: list[np.ndarray] = []
    count = 0
    try:
        while count < cap:
            block = audio.read(min(_BLOCK_FRAMES, cap - count), dtype="float32", always_2d=True)
            if len(block) == 0:
                break
            blocks.append(block)
            count += len(block)
        more = count >= cap and len(audio.read(1, dtype="float32", always_2d=True)) > 0
    except Exception as exc:  # corrupt or truncated data mid-stream
        raise _unsupported(exc) from exc
    if not blocks:
        return np.zeros((0, audio.channels), dtype=np.float32), False
    return np.concatenate(blocks), more


def _unsupported(exc: Exception) -> UnsupportedAudio:
    return UnsupportedAudio(
        "the file could not be decoded as audio (WAV, FLAC, OGG or MP3)",
        details={"reason": str(exc)[:200]},
    )
