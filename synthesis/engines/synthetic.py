"""A deterministic measuring instrument that behaves like a GPU engine. Never speech.

It exists to test and benchmark the service's scheduling without a GPU: its
output is a tone derived from the text (and voice), and its timing and memory
use emulate one accelerator shared by every process on the machine:

* Compute: each synthesis spends device time (a first-chunk delay, then
  `rtf` seconds per second of audio) only while holding an exclusive lock on the
  device's lock file, in short slices. Two syntheses on one device therefore
  share it and each runs at about half speed, whether they are threads or
  separate processes; see `DeviceClock`.
* Memory: `load()` reserves `model_memory_bytes` in the device's ledger file and
  fails with `EngineOutOfMemory` when the device is full; see `MemoryLedger`.
"""

from __future__ import annotations

import atexit
import hashlib
import math
import tempfile
import uuid
from collections.abc import Generator
from pathlib import Path

import numpy as np

from chorus.errors import EngineError
from synthesis.engines.base import (
    EngineInfo,
    PreparedVoice,
    ReferenceAudio,
    Samples,
    check_speed,
    dump_json_voice,
    load_json_voice,
)
from synthesis.engines.emulated_device import DeviceClock, GiB, MemoryLedger, check_device_name

AMPLITUDE = 0.3


def default_state_dir() -> Path:
    return Path(tempfile.gettempdir()) / "chorus-emulated-gpu"


class SyntheticEngine:
    name = "synthetic"
    supports_streaming_speed = True
    deterministic = True

    def __init__(
        self,
        *,
        sample_rate: int = 24000,
        first_chunk_delay_s: float = 0.2,
        rtf: float = 0.1,
        chunk_s: float = 0.5,
        seconds_per_char: float = 0.06,
        device: str = "emu0",
        device_memory_bytes: int = 16 * GiB,
        model_memory_bytes: int = 2 * GiB,
        state_dir: str | Path | None = None,
        prepare_s: float = 0.0,
    ) -> None:
        # Options may arrive as strings from environment-based settings.
        self.sample_rate = int(sample_rate)
        self.first_chunk_delay_s = float(first_chunk_delay_s)
        self.rtf = float(rtf)
        self.chunk_s = float(chunk_s)
        self.seconds_per_char = float(seconds_per_char)
        self.device = check_device_name(str(device))
        self.device_memory_bytes = int(device_memory_bytes)
        self.model_memory_bytes = int(model_memory_bytes)
        self.prepare_s = float(prepare_s)
        if self.sample_rate <= 0 or self.chunk_s <= 0 or self.seconds_per_char <= 0:
            raise ValueError("sample_rate, chunk_s and seconds_per_char must be positive")
        if min(self.first_chunk_delay_s, self.rtf, self.prepare_s) < 0:
            raise ValueError("first_chunk_delay_s, rtf and prepare_s must not be negative")
        if self.model_memory_bytes < 0 or self.device_memory_bytes <= 0:
            raise ValueError("memory sizes must be positive")

        directory = Path(state_dir) if state_dir is not None else default_state_dir()
        self.clock = DeviceClock(directory, self.device)
        self.ledger = MemoryLedger(directory, self.device, self.device_memory_bytes)
        self._instance_id = uuid.uuid4().hex
        self._loaded = False

    # --- lifecycle ------------------------------------------------------------

    def load(self) -> None:
        if self._loaded:
            return
        self.ledger.reserve(self._instance_id, self.model_memory_bytes, engine=self.name)
        self._loaded = True
        # A worker that exits without close() still frees its reservation; one that
        # dies without running atexit is pruned by pid on the next ledger update.
        atexit.register(self.close)

    def close(self) -> None:
        if not self._loaded:
            return
        self._loaded = False
        atexit.unregister(self.close)
        self.ledger.release(self._instance_id)

    def info(self) -> EngineInfo:
        return EngineInfo(
            name=self.name,
            sample_rate=self.sample_rate,
            device=f"emulated:{self.device}",
            memory_bytes=self.model_memory_bytes,
        )

    # --- voices and synthesis ---------------------------------------------------

    def prepare_voice(self, reference: ReferenceAudio) -> PreparedVoice:
        """Fingerprint the reference samples (the emulated 'speaker embedding')."""
        self._require_loaded()
        self.clock.spend(self.prepare_s)
        samples = np.ascontiguousarray(reference.samples, dtype=np.float32)
        digest = hashlib.sha256(samples.tobytes())
        digest.update(str(reference.sample_rate).encode())
        return PreparedVoice(
            engine=self.name,
            data={
                "fingerprint": digest.hexdigest(),
                "duration_s": round(len(samples) / reference.sample_rate, 3),
                "language": reference.language,
            },
        )

    def audio_seconds(self, text: str, speed: float = 1.0) -> float:
        """How long the audio for `text` at `speed` is (the contract tests rely on)."""
        return max(0.5, len(text) * self.seconds_per_char) / speed

    def dump_voice(self, voice: PreparedVoice) -> bytes:
        return dump_json_voice(voice)

    def load_voice(self, data: bytes) -> PreparedVoice:
        return load_json_voice(data, engine=self.name)

    def synthesize(
        self,
        *,
        text: str,
        voice: PreparedVoice | None,
        speed: float = 1.0,
        instruction: str = "",
    ) -> Generator[Samples, None, None]:
        self._require_loaded()
        check_speed(speed)
        total = round(self.audio_seconds(text, speed) * self.sample_rate)
        fingerprint = str(voice.data.get("fingerprint", "")) if voice is not None else ""
        return self._stream(total, _tone_hz(text, fingerprint, instruction))

    def _stream(self, total: int, hz: float) -> Generator[Samples, None, None]:
        per_chunk = max(1, round(self.chunk_s * self.sample_rate))
        step = 2.0 * math.pi * hz / self.sample_rate
        start = 0
        while start < total:
            count = min(per_chunk, total - start)
            compute = self.rtf * count / self.sample_rate
            if start == 0:
                compute += self.first_chunk_delay_s
            self.clock.spend(compute)
            # Phase continues across chunks, so the joined stream is one clean tone.
            phase = step * np.arange(start, start + count, dtype=np.float64)
            yield (AMPLITUDE * np.sin(phase)).astype(np.float32)
            start += count

    def _require_loaded(self) -> None:
        if not self._loaded:
            raise EngineError("synthetic engine used before load() (or after close())")


def _tone_hz(text: str, fingerprint: str, instruction: str = "") -> float:
    """A frequency in [200, 800) Hz fixed by the text, voice and instruction."""
    # The instruction joins the hash only when given, so outputs without one stay
    # exactly what they were before instructions existed.
    key = f"{fingerprint}\n{text}" + (f"\n{instruction}" if instruction else "")
    digest = hashlib.sha256(key.encode()).digest()
    return 200.0 + int.from_bytes(digest[:4], "big") % 60000 / 100.0
