"""A deterministic measuring instrument that behaves like a GPU engine. Never speech.

It exists to test and benchmark the service's scheduling without a GPU: its
output is a tone derived from the text (and voice), and its timing and memory
use emulate one accelerator shared by every process on the machine:

* Timing and memory follow a device profile (`device_profiles`; default
  `t4-cosyvoice2`, calibrated to CosyVoice2 on a T4): alone on the device a
  stream's first chunk comes after `first_chunk_delay_s` plus `rtf` times its
  audio, and the rest at `rtf`; while several streams share the device each is
  slowed along the profile's measured curve, whether they are threads of one
  worker or separate processes. See `EmulatedDevice`.
* Memory: `load()` reserves the model's memory and every stream reserves its
  own while it runs; either fails with `EngineOutOfMemory` when the device is
  full, as CUDA would. See `MemoryLedger`.

Any timing or memory option given explicitly overrides the profile's value.
`time_scale` multiplies every delay (benches and tests run the curve faster: its
ratios are what matter). `calibrate`: a worker with `CHORUS_DEVICE_PROFILE=auto`
measures this engine as it would an unknown card, instead of reading its profile
(`synthesis.calibration`).

A realtime session's text may also come as it is written
(`synthesize_text_stream`), as cosyvoice2 takes it: a turn's first chunk comes
after the first-chunk delay once a chunk's worth of text is in, the rest at the
device's pace as text arrives, with no delay per sentence. `streams_text`
false makes the engine take whole sentences instead, as espeak does.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import json
import math
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from django.conf import settings

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
from synthesis.engines.device_profiles import DeviceProfile, get_profile
from synthesis.engines.emulated_device import (
    QUANTUM_S,
    DeviceStream,
    EmulatedDevice,
    GiB,
    check_device_name,
)

__all__ = ["GiB", "SyntheticEngine"]

AMPLITUDE = 0.3


def default_state_dir() -> Path:
    """The emulated devices' ledgers, inside the stack's data folder: the processes
    of one stack share its devices, and two stacks on one host (each with its own
    CHORUS_DATA_DIR) are two machines. A folder shared by the whole host made one
    stack's `emu0` another's, whose streams then failed engine_out_of_memory."""
    return Path(settings.DATA_DIR) / "emulated-gpu"


class SyntheticEngine:
    name = "synthetic"
    supports_streaming_speed = True
    deterministic = True
    # Threads of one worker share the engine; the device profile, not the
    # engine, limits how many streams run at once.
    max_concurrent_streams: int | None = None
    # It stands in for cosyvoice2: an instruction changes its signal (deterministically).
    follows_instructions = True

    def __init__(
        self,
        *,
        profile: str | DeviceProfile | None = None,
        sample_rate: int = 24000,
        first_chunk_delay_s: float | None = None,
        rtf: float | None = None,
        chunk_s: float | None = None,
        seconds_per_char: float = 0.06,
        device: str = "emu0",
        device_memory_bytes: int | None = None,
        model_memory_bytes: int | None = None,
        stream_memory_bytes: int | None = None,
        state_dir: str | Path | None = None,
        prepare_s: float = 0.0,
        time_scale: float = 1.0,
        calibrate: bool | str = False,
        streams_text: bool | str = True,
    ) -> None:
        base = get_profile(profile)
        # Options may arrive as strings from environment-based settings.
        self.profile = dataclasses.replace(
            base,
            memory_bytes=_or(device_memory_bytes, base.memory_bytes, int),
            model_bytes=_or(model_memory_bytes, base.model_bytes, int),
            stream_bytes=_or(stream_memory_bytes, base.stream_bytes, int),
        )
        self.sample_rate = int(sample_rate)
        scale = float(time_scale)
        if scale <= 0:
            raise ValueError("time_scale must be positive")
        self.first_chunk_delay_s = _or(first_chunk_delay_s, base.first_chunk_delay_s, float) * scale
        self.rtf = _or(rtf, base.rtf, float) * scale
        self.calibrate = str(calibrate).strip().lower() in {"1", "true", "yes", "on"}
        self.streams_text = str(streams_text).strip().lower() in {"1", "true", "yes", "on"}
        self.chunk_s = _or(chunk_s, base.first_chunk_audio_s, float)
        self.seconds_per_char = float(seconds_per_char)
        self.device = check_device_name(str(device))
        self.prepare_s = float(prepare_s)
        if self.sample_rate <= 0 or self.chunk_s <= 0 or self.seconds_per_char <= 0:
            raise ValueError("sample_rate, chunk_s and seconds_per_char must be positive")
        if min(self.first_chunk_delay_s, self.rtf, self.prepare_s) < 0:
            raise ValueError("first_chunk_delay_s, rtf and prepare_s must not be negative")

        directory = Path(state_dir) if state_dir is not None else default_state_dir()
        # The device's time resolution scales with its delays, so a faster curve
        # keeps its shape (a stream re-reads how many share the card as often,
        # relative to its work).
        self.emulated = EmulatedDevice(
            directory, self.device, self.profile, quantum_s=QUANTUM_S * min(1.0, scale)
        )
        self.ledger = self.emulated.ledger
        self._instance_id = uuid.uuid4().hex
        self._loaded = False

    @property
    def model_memory_bytes(self) -> int:
        return self.profile.model_bytes

    @property
    def device_memory_bytes(self) -> int:
        return self.profile.memory_bytes

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

    def calibration_identity(self) -> dict[str, Any]:
        """What makes this emulated card's curve (`synthesis.calibration.identity`)."""
        curve = {
            "first_audio_s": self.profile.first_audio_s,
            "total_s": self.profile.total_s,
            "first_chunk_delay_s": self.first_chunk_delay_s,
            "rtf": self.rtf,
            "chunk_s": self.chunk_s,
            "seconds_per_char": self.seconds_per_char,
            "model_bytes": self.profile.model_bytes,
            "stream_bytes": self.profile.stream_bytes,
        }
        encoded = json.dumps(curve, sort_keys=True).encode()
        return {
            "card": f"emulated {self.profile.name}",
            "memory_bytes": self.profile.memory_bytes,
            "model": hashlib.sha256(encoded).hexdigest(),
            "flags": {},
            "versions": {},
        }

    def device_memory(self) -> tuple[int, int]:
        """(used, total) bytes of the emulated card, every process's share included."""
        return self.ledger.used_bytes(), self.profile.memory_bytes

    # --- voices and synthesis ---------------------------------------------------

    def prepare_voice(self, reference: ReferenceAudio) -> PreparedVoice:
        """Fingerprint the reference samples (the emulated 'speaker embedding')."""
        self._require_loaded()
        if self.prepare_s > 0:
            with self.emulated.stream(engine=self.name) as stream:
                stream.spend(self.prepare_s, first=True)
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
        # The stream holds its device memory from its first chunk until it ends
        # or is closed (a cancelled job frees it at once).
        with self.emulated.stream(engine=self.name) as stream:
            while start < total:
                count = min(per_chunk, total - start)
                yield self._chunk(stream, start, count, step)
                start += count

    def _chunk(self, stream: DeviceStream, start: int, count: int, step: float) -> Samples:
        """Samples `start` to `start + count` of the tone, once the device has
        spent their time (a stream's first chunk also its first-chunk delay)."""
        compute = self.rtf * count / self.sample_rate
        if start == 0:
            compute += self.first_chunk_delay_s
        stream.spend(compute, first=start == 0)
        # Phase continues across chunks, so the joined stream is one clean tone.
        phase = step * np.arange(start, start + count, dtype=np.float64)
        return (AMPLITUDE * np.sin(phase)).astype(np.float32)

    def synthesize_text_stream(
        self, *, texts: Iterator[str], voice: PreparedVoice | None, instruction: str = ""
    ) -> Generator[Samples, None, None]:
        """A turn's text as it is written (see the module's docstring)."""
        self._require_loaded()
        fingerprint = str(voice.data.get("fingerprint", "")) if voice is not None else ""
        return self._stream_text(iter(texts), _tone_hz("", fingerprint, instruction))

    def _stream_text(self, texts: Iterator[str], hz: float) -> Generator[Samples, None, None]:
        per_chunk = max(1, round(self.chunk_s * self.sample_rate))
        step = 2.0 * math.pi * hz / self.sample_rate
        characters = 0  # of the turn's text so far
        ended = False
        start = 0
        with self.emulated.stream(engine=self.name) as stream:
            while True:
                available = round(characters * self.seconds_per_char * self.sample_rate)
                if not ended and available - start < per_chunk:
                    # Not a chunk's worth of text yet: wait for more, as the
                    # model's decoding waits for text tokens.
                    try:
                        characters += len(next(texts))
                    except StopIteration:
                        ended = True
                    continue
                if start >= available:
                    return
                count = min(per_chunk, available - start)
                yield self._chunk(stream, start, count, step)
                start += count

    def _require_loaded(self) -> None:
        if not self._loaded:
            raise EngineError("synthetic engine used before load() (or after close())")


def _or(value: object, default: float, kind: type) -> Any:
    return kind(value) if value is not None else kind(default)


def _tone_hz(text: str, fingerprint: str, instruction: str = "") -> float:
    """A frequency in [200, 800) Hz fixed by the text, voice and instruction."""
    # The instruction joins the hash only when given, so outputs without one stay
    # exactly what they were before instructions existed.
    key = f"{fingerprint}\n{text}" + (f"\n{instruction}" if instruction else "")
    digest = hashlib.sha256(key.encode()).digest()
    return 200.0 + int.from_bytes(digest[:4], "big") % 60000 / 100.0
