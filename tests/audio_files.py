"""Real audio files made on the fly for tests (no fixtures on disk)."""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf


def tone(seconds: float, sample_rate: int, channels: int = 1, hz: float = 220.0) -> np.ndarray:
    t = np.arange(round(seconds * sample_rate)) / sample_rate
    mono = (0.4 * np.sin(2 * np.pi * hz * t)).astype(np.float32)
    return np.repeat(mono[:, None], channels, axis=1) if channels > 1 else mono


def audio_file(
    seconds: float,
    sample_rate: int = 22050,
    *,
    channels: int = 1,
    format: str = "WAV",
    subtype: str | None = None,
) -> bytes:
    buffer = io.BytesIO()
    sf.write(
        buffer, tone(seconds, sample_rate, channels), sample_rate, format=format, subtype=subtype
    )
    return buffer.getvalue()


def streamed_file(
    seconds: int,
    sample_rate: int,
    *,
    channels: int = 2,
    format: str = "FLAC",
    subtype: str | None = None,
    silent: bool = False,
) -> bytes:
    """A long file written a second at a time: never the whole recording in memory.

    Silent and high-rate, it is a decompression bomb's shape (70 s of 384 kHz
    stereo is 215 MB of float32 and about 116 KB of FLAC). One large write also
    crashes libsndfile's Vorbis encoder.
    """
    one = np.zeros((sample_rate, channels), dtype=np.float32)
    if not silent:
        one[:] = tone(1.0, sample_rate).reshape(sample_rate, 1)
    buffer = io.BytesIO()
    with sf.SoundFile(buffer, "w", sample_rate, channels, format=format, subtype=subtype) as out:
        for _ in range(seconds):
            out.write(one)
    return buffer.getvalue()
