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
