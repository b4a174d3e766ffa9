"""CosyVoice2-0.5B voice cloning through the upstream runtime (FunAudioLLM/CosyVoice).

Upstream is not pip-installable: a deployment clones it (with Matcha-TTS under
`third_party/`), installs its requirements, and names the clone in `src_dir`.
Nothing of it (or torch) is imported before `load()`, so the rest of Chorus runs
and tests without either. See /work/shared/UPSTREAM-COSYVOICE.md for the facts
this adapter is written against.

Concurrency: upstream has no batching and races on a field shared by all streams
on one model instance (`token_hop_len`), so each instance serves one call at a
time under its own lock. `slots` instances (each a full copy of the weights) let
that many calls run at once; a call blocks until one is free. In vLLM mode there is
exactly one instance, because each vLLM engine reserves its own share of GPU
memory; its calls are serialized too, so vLLM there speeds up each decode rather
than batching several.

Voices: `add_zero_shot_spk` computes the prompt once, but keeps it in one dict per
instance (`frontend.spk2info`) that every tenant would share. The adapter only
borrows that dict: prepare_voice moves the entry out into the PreparedVoice (as
numpy arrays owned by that voice), and each synthesis installs a fresh copy under a
per-call id and removes it afterwards.

Modes: with an instruction, `inference_instruct2`; else, with a transcript,
`inference_zero_shot` (the LLM continues the reference's text and speech tokens, so
prosody follows the reference closely); a voice without transcript uses
`inference_cross_lingual`, which drops the reference's text and speech tokens from
the LLM prompt and keeps only the speaker embedding and acoustic prompt: timbre is
cloned, prosody less so, and the reference may be in another language than the text.

Speed: upstream streams only at speed 1.0 (it asserts otherwise). At other speeds
the adapter synthesizes without streaming, so audio arrives in one chunk per text
segment (`supports_streaming_speed = False`).
"""

from __future__ import annotations

import importlib
import io
import json
import logging
import os
import sys
import tempfile
import threading
import uuid
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soundfile

from chorus.errors import (
    AudioTooLong,
    ChorusError,
    EngineError,
    EngineOutOfMemory,
    EngineUnavailable,
    InvalidInput,
    SampleRateTooLow,
)
from synthesis.engines.base import (
    EngineInfo,
    PreparedVoice,
    ReferenceAudio,
    Samples,
    check_speed,
)

log = logging.getLogger(__name__)

REQUIRED_FILES = (
    "cosyvoice2.yaml",
    "llm.pt",
    "flow.pt",
    "hift.pt",
    "campplus.onnx",
    "speech_tokenizer_v2.onnx",
)
REQUIRED_FOLDERS = ("CosyVoice-BlankEN",)
SAMPLE_RATE = 24000
MIN_PROMPT_RATE = 16000  # upstream asserts these two on every prompt it loads
MAX_PROMPT_SECONDS = 30.0
DUMP_FORMAT = 1
_INSTALL_HINT = (
    "clone FunAudioLLM/CosyVoice with --recursive, install its requirements.txt into this "
    "environment, and set COSYVOICE_SRC (the engine's src_dir option) to the clone; the "
    "PyPI package named 'cosyvoice' is unrelated and does not work"
)


@dataclass
class _Slot:
    """One model instance; only the holder of `lock` may call into `model`."""

    index: int
    model: Any
    lock: threading.Lock = field(default_factory=threading.Lock)


class CosyVoice2Engine:
    name = "cosyvoice2"
    supports_streaming_speed = False
    deterministic = False  # the LLM samples its speech tokens

    def __init__(
        self,
        *,
        model_dir: str,
        src_dir: str | None = None,
        fp16: bool | str = False,
        load_jit: bool | str = False,
        load_trt: bool | str = False,
        load_vllm: bool | str = False,
        trt_concurrent: int | str = 1,
        slots: int | str = 1,
    ) -> None:
        # Options may arrive as strings from environment-based settings.
        self.model_dir = Path(model_dir)
        self.src_dir = Path(src_dir) if src_dir else None
        self.fp16 = _flag("fp16", fp16)
        self.load_jit = _flag("load_jit", load_jit)
        self.load_trt = _flag("load_trt", load_trt)
        self.load_vllm = _flag("load_vllm", load_vllm)
        self.trt_concurrent = _positive("trt_concurrent", trt_concurrent)
        self.slots = _positive("slots", slots)
        self.sample_rate = SAMPLE_RATE  # replaced by what the loaded model reports
        self._slots: list[_Slot] = []
        # Counts free slots, so a caller waits for one instead of polling the locks.
        self._free = threading.Semaphore(0)

    # --- lifecycle ------------------------------------------------------------------

    def load(self) -> None:
        if self._slots:
            return
        self._check_model_dir()  # before importing anything: the cheap, clear failure
        model_class = self._import_upstream()
        count = 1 if self.load_vllm else self.slots
        if self.load_vllm and self.slots > 1:
            log.warning("cosyvoice2: vLLM mode loads one instance; slots=%d ignored", self.slots)
        models: list[Any] = []
        for index in range(count):
            try:
                models.append(
                    model_class(
                        str(self.model_dir),
                        load_jit=self.load_jit,
                        load_trt=self.load_trt,
                        load_vllm=self.load_vllm,
                        fp16=self.fp16,
                        trt_concurrent=self.trt_concurrent,
                    )
                )
            except Exception as exc:
                models.clear()
                if _is_out_of_memory(exc):
                    _free_device_memory()
                    raise EngineOutOfMemory(
                        f"not enough GPU memory to load CosyVoice2 instance {index + 1} of "
                        f"{count}; lower slots (CHORUS_ENGINE_SLOTS) or trt_concurrent",
                        details={"engine": self.name, "slots": count},
                    ) from exc
                raise EngineUnavailable(
                    f"CosyVoice2 failed to load from {self.model_dir}: {exc}",
                    details={"engine": self.name, "model_dir": str(self.model_dir)},
                ) from exc
        self.sample_rate = int(getattr(models[0], "sample_rate", SAMPLE_RATE))
        self._slots = [_Slot(index, model) for index, model in enumerate(models)]
        self._free = threading.Semaphore(len(self._slots))

    def _check_model_dir(self) -> None:
        missing = [name for name in REQUIRED_FILES if not (self.model_dir / name).is_file()]
        missing += [f"{name}/" for name in REQUIRED_FOLDERS if not (self.model_dir / name).is_dir()]
        if missing:
            raise EngineUnavailable(
                f"CosyVoice2 model folder {self.model_dir} is missing: {', '.join(missing)} "
                "(download CosyVoice2-0.5B there; COSYVOICE_MODEL_DIR names the folder)",
                details={"engine": self.name, "model_dir": str(self.model_dir), "missing": missing},
            )

    def _import_upstream(self) -> Any:
        if self.src_dir is not None:
            if not self.src_dir.is_dir():
                raise EngineUnavailable(
                    f"CosyVoice source folder {self.src_dir} does not exist; {_INSTALL_HINT}",
                    details={"engine": self.name, "src_dir": str(self.src_dir)},
                )
            # Front of the path, so the clone wins over anything else named `cosyvoice`.
            for path in (self.src_dir / "third_party" / "Matcha-TTS", self.src_dir):
                if path.is_dir() and str(path) not in sys.path:
                    sys.path.insert(0, str(path))
        try:
            module = importlib.import_module("cosyvoice.cli.cosyvoice")
            return module.CosyVoice2
        except (ImportError, AttributeError) as exc:
            raise EngineUnavailable(
                f"cannot import the CosyVoice runtime ({exc}); {_INSTALL_HINT}",
                details={"engine": self.name, "src_dir": str(self.src_dir or "")},
            ) from exc

    def close(self) -> None:
        # A call still running keeps its own reference to its model until it ends.
        slots, self._slots = self._slots, []
        self._free = threading.Semaphore(0)
        for slot in slots:
            slot.model = None
        if slots:
            _free_device_memory()

    def info(self) -> EngineInfo:
        torch = _torch()
        if torch is not None and torch.cuda.is_available():
            device = f"cuda:{torch.cuda.current_device()}"
            memory = int(torch.cuda.memory_allocated())
        else:
            device, memory = "cpu", 0
        return EngineInfo(
            name=self.name, sample_rate=self.sample_rate, device=device, memory_bytes=memory
        )

    @contextmanager
    def _slot(self) -> Iterator[_Slot]:
        """Exclusive use of one model instance; blocks until one is free."""
        if not self._slots:
            raise EngineError("cosyvoice2 engine used before load() (or after close())")
        slots, free = self._slots, self._free
        free.acquire()
        # The semaphore counts unlocked slots, so one of these attempts succeeds.
        slot = next(s for s in slots if s.lock.acquire(blocking=False))
        try:
            yield slot
        finally:
            slot.lock.release()
            free.release()

    # --- voices -------------------------------------------------------------------------

    def prepare_voice(self, reference: ReferenceAudio) -> PreparedVoice:
        """Compute the prompt (speech tokens, speaker embedding, features) once."""
        if reference.sample_rate < MIN_PROMPT_RATE:
            raise SampleRateTooLow(
                f"CosyVoice2 needs reference audio of at least {MIN_PROMPT_RATE} Hz",
                details={"sample_rate": reference.sample_rate},
            )
        seconds = len(reference.samples) / reference.sample_rate
        if seconds > MAX_PROMPT_SECONDS:
            raise AudioTooLong(
                f"CosyVoice2 takes at most {MAX_PROMPT_SECONDS:.0f} s of reference audio",
                details={"seconds": round(seconds, 2)},
            )
        pcm = _to_pcm16(reference.samples)
        spk_id = f"chorus-prepare-{uuid.uuid4().hex}"
        with self._slot() as slot, _wav_file(pcm, reference.sample_rate) as path:
            spk2info = slot.model.frontend.spk2info
            try:
                slot.model.add_zero_shot_spk(reference.transcript, path, spk_id)
                entry = spk2info[spk_id]
            except ChorusError:
                raise
            except Exception as exc:
                raise self._failure(exc, "preparing a voice") from exc
            finally:
                # Never leave a tenant's prompt in the instance's shared dict.
                spk2info.pop(spk_id, None)
        prompt = {key: np.array(_to_numpy(value), copy=True) for key, value in entry.items()}
        return PreparedVoice(
            engine=self.name,
            data={
                "prompt": prompt,
                "prompt_text": reference.transcript,
                # Kept for instructions: with a speaker id upstream would take the
                # LLM prompt from the stored entry and silently drop the instruction.
                "reference": pcm,
                "reference_rate": reference.sample_rate,
            },
        )

    def dump_voice(self, voice: PreparedVoice) -> bytes:
        """An .npz archive of plain arrays plus a JSON header; loadable without pickle."""
        self._check_voice(voice)
        arrays = {f"prompt/{key}": value for key, value in voice.data["prompt"].items()}
        meta = {
            "format": DUMP_FORMAT,
            "engine": self.name,
            "prompt_text": voice.data["prompt_text"],
            "reference_rate": voice.data["reference_rate"],
        }
        buffer = io.BytesIO()
        np.savez_compressed(
            buffer, meta=np.array(json.dumps(meta)), reference=voice.data["reference"], **arrays
        )
        return buffer.getvalue()

    def load_voice(self, data: bytes) -> PreparedVoice:
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as archive:
                meta = json.loads(str(archive["meta"]))
                prompt = {
                    key.removeprefix("prompt/"): archive[key]
                    for key in archive.files
                    if key.startswith("prompt/")
                }
                reference = archive["reference"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise EngineError(f"stored cosyvoice2 voice prompt is unreadable: {exc}") from exc
        if not isinstance(meta, dict) or meta.get("engine") != self.name:
            raise EngineError("stored voice prompt was not made by engine 'cosyvoice2'")
        if meta.get("format") != DUMP_FORMAT:
            raise EngineError(f"stored cosyvoice2 voice prompt has format {meta.get('format')}")
        return PreparedVoice(
            engine=self.name,
            data={
                "prompt": prompt,
                "prompt_text": str(meta["prompt_text"]),
                "reference": reference,
                "reference_rate": int(meta["reference_rate"]),
            },
        )

    def _check_voice(self, voice: PreparedVoice) -> None:
        if voice.engine != self.name or not isinstance(voice.data.get("prompt"), dict):
            raise InvalidInput(
                f"voice was prepared by engine {voice.engine!r}, not {self.name!r}",
                details={"engine": voice.engine},
            )

    # --- synthesis ------------------------------------------------------------------------

    def synthesize(
        self,
        *,
        text: str,
        voice: PreparedVoice | None,
        speed: float = 1.0,
        instruction: str = "",
    ) -> Generator[Samples, None, None]:
        # Checked now, not at the first chunk; the slot is taken only once iterated, so
        # a stream that is never started holds nothing.
        if not self._slots:
            raise EngineError("cosyvoice2 engine used before load() (or after close())")
        check_speed(speed)
        if voice is None:
            raise InvalidInput(
                "cosyvoice2 clones a voice: a reference voice is required",
                details={"engine": self.name},
            )
        self._check_voice(voice)
        return self._stream(text, voice, float(speed), instruction.strip())

    def _stream(
        self, text: str, voice: PreparedVoice, speed: float, instruction: str
    ) -> Generator[Samples, None, None]:
        stream = speed == 1.0  # upstream asserts on streaming at any other speed
        with self._slot() as slot:
            outputs: Iterator[dict[str, Any]] | None = None
            spk2info = slot.model.frontend.spk2info
            call_id = f"chorus-call-{uuid.uuid4().hex}"
            try:
                with _instruct_prompt(voice, instruction) as prompt_wav:
                    outputs = self._start(
                        slot.model, call_id, text, voice, instruction, prompt_wav, stream, speed
                    )
                    for item in outputs:
                        yield _to_samples(item["tts_speech"])
            except ChorusError:
                raise
            except Exception as exc:
                raise self._failure(exc, f"synthesis on instance {slot.index}") from exc
            finally:
                if outputs is not None and hasattr(outputs, "close"):
                    outputs.close()  # stops the upstream generator if we were closed early
                spk2info.pop(call_id, None)

    def _start(
        self,
        model: Any,
        call_id: str,
        text: str,
        voice: PreparedVoice,
        instruction: str,
        prompt_wav: str,
        stream: bool,
        speed: float,
    ) -> Iterator[dict[str, Any]]:
        """Pick the upstream mode for this voice and call; return its output generator."""
        if instruction:
            # No speaker id here: with one, upstream takes the LLM prompt text from the
            # stored entry (the transcript) and the instruction would be silently lost.
            return model.inference_instruct2(
                text, instruction, prompt_wav, stream=stream, speed=speed
            )
        # A fresh copy per call under its own id: some upstream versions delete keys
        # from the entry they are given (cross-lingual), and the dict is the instance's.
        model.frontend.spk2info[call_id] = {
            key: _to_tensor(value) for key, value in voice.data["prompt"].items()
        }
        if voice.data["prompt_text"]:
            return model.inference_zero_shot(
                text,
                voice.data["prompt_text"],
                "",  # ignored by upstream when zero_shot_spk_id is given
                zero_shot_spk_id=call_id,
                stream=stream,
                speed=speed,
            )
        return model.inference_cross_lingual(
            text, "", zero_shot_spk_id=call_id, stream=stream, speed=speed
        )

    def _failure(self, exc: Exception, doing: str) -> EngineError:
        """The domain error for an upstream failure; frees memory after an OOM."""
        if _is_out_of_memory(exc):
            _free_device_memory()
            return EngineOutOfMemory(
                f"GPU out of memory during {doing}; the worker freed its cache and keeps "
                "serving: retry later, or with shorter text",
                details={"engine": self.name},
            )
        return EngineError(
            f"cosyvoice2 failed during {doing}: {type(exc).__name__}: {exc}",
            details={"engine": self.name},
        )


# --- helpers --------------------------------------------------------------------------------


def _flag(name: str, value: bool | str) -> bool:
    if isinstance(value, bool):
        return value
    lowered = str(value).strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"", "0", "false", "no", "off"}:
        return False
    raise ValueError(f"{name} must be a boolean, not {value!r}")


def _positive(name: str, value: int | str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(f"{name} must be at least 1, not {number}")
    return number


def _torch() -> Any | None:
    """torch if installed (it always is beside the real upstream), else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def _is_out_of_memory(exc: BaseException) -> bool:
    torch = _torch()
    if torch is not None and isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def _free_device_memory() -> None:
    torch = _torch()
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _to_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "cpu"):  # a torch tensor, possibly on the GPU
        value = value.detach() if hasattr(value, "detach") else value
        return np.asarray(value.cpu().numpy())
    return np.asarray(value)


def _to_tensor(array: np.ndarray) -> Any:
    """A tensor on the model's device for upstream; the array itself without torch."""
    torch = _torch()
    if torch is None:
        return np.array(array, copy=True)
    # Upstream puts its prompt tensors on CUDA when available, else the CPU.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.from_numpy(np.array(array, copy=True)).to(device)


def _to_samples(speech: Any) -> Samples:
    samples = _to_numpy(speech).astype(np.float32, copy=False)
    if samples.ndim == 2:  # (1, n), or (channels, n) which we mix down
        samples = samples.mean(axis=0) if samples.shape[0] > 1 else samples[0]
    return np.ascontiguousarray(samples.reshape(-1), dtype=np.float32)


def _to_pcm16(samples: np.ndarray) -> np.ndarray:
    clipped = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0)
    return np.round(clipped * 32767.0).astype(np.int16)


@contextmanager
def _wav_file(pcm: np.ndarray, sample_rate: int) -> Iterator[str]:
    """A temporary WAV of `pcm`: upstream reads prompts from a path, with soundfile."""
    handle, path = tempfile.mkstemp(prefix="chorus-prompt-", suffix=".wav")
    os.close(handle)
    try:
        soundfile.write(path, pcm, sample_rate, subtype="PCM_16")
        yield path
    finally:
        os.unlink(path)


@contextmanager
def _instruct_prompt(voice: PreparedVoice, instruction: str) -> Iterator[str]:
    """The reference as a WAV path when an instruction needs it, else ''."""
    if not instruction:
        yield ""
        return
    with _wav_file(np.asarray(voice.data["reference"]), int(voice.data["reference_rate"])) as path:
        yield path
