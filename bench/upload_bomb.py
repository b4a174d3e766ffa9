"""Upload bombs: what validating a voice upload costs, bomb against normal recording.

Times (median of --repeat runs) and peak memory allocated (tracemalloc, which
sees numpy's buffers) of `decode_reference` called as `voice_create` calls it
for the default plan (3-30 s, 16-48 kHz). No database, no Django.

  .venv/bin/python bench/upload_bomb.py [--repeat 5]

Before the header checks and the decode cap, the audit measured 163 MiB more
RSS and 1.16 s per 384 kHz bomb in the web process; run this from an older
checkout for the matching "before" row (it falls back to the old signature).
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chorus.errors import ChorusError
from synthesis import audio

MB = 1024 * 1024


def streamed(seconds: int, rate: int, channels: int, fmt: str, *, silent: bool) -> bytes:
    """Written a second at a time, so building a bomb does not cost what decoding it did."""
    t = np.arange(rate) / rate
    one = np.zeros((rate, channels), dtype=np.float32)
    if not silent:
        one[:] = (0.4 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)[:, None]
    buffer = io.BytesIO()
    with sf.SoundFile(buffer, "w", rate, channels, format=fmt) as out:
        for _ in range(seconds):
            out.write(one)
    return buffer.getvalue()


CASES: list[tuple[str, Callable[[], bytes]]] = [
    ("bomb: 70 s 384 kHz stereo silent FLAC", lambda: streamed(70, 384000, 2, "FLAC", silent=True)),
    ("70 s 48 kHz stereo silent FLAC", lambda: streamed(70, 48000, 2, "FLAC", silent=True)),
    ("60 s 48 kHz stereo silent FLAC", lambda: streamed(60, 48000, 2, "FLAC", silent=True)),
    (
        "70 s 48 kHz stereo MP3 (length by decoding)",
        lambda: streamed(70, 48000, 2, "MP3", silent=False),
    ),
    ("normal: 10 s 24 kHz mono WAV", lambda: streamed(10, 24000, 1, "WAV", silent=False)),
]


def validate(data: bytes) -> str:
    limits: dict[str, int] = {"max_bytes": 20 * MB}
    if hasattr(audio, "MAX_UPLOAD_SAMPLE_RATE"):  # absent before the upload ceiling
        limits["max_sample_rate"] = audio.MAX_UPLOAD_SAMPLE_RATE
    try:
        decoded = audio.decode_reference(data, **limits)
    except ChorusError as error:
        return f"{error.status} {error.code}"
    return f"accepted, {decoded.duration_s:.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    print(f"{'file':46} {'size':>9} {'outcome':28} {'time':>9} {'peak':>10}")
    for name, build in CASES:
        data = build()
        outcome = validate(data)
        times = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            validate(data)
            times.append(time.perf_counter() - started)
        tracemalloc.start()
        validate(data)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(
            f"{name:46} {len(data) / 1024:7.0f} KB {outcome:28} "
            f"{statistics.median(times) * 1000:6.1f} ms {peak / MB:6.2f} MiB"
        )
    print("audit, before: the 384 kHz bomb cost the web process +163 MiB RSS and 1.16 s")


if __name__ == "__main__":
    main()
