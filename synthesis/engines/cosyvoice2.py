"""CosyVoice2-0.5B voice cloning through the upstream runtime (FunAudioLLM/CosyVoice).

Upstream is not pip-installable: a deployment clones it (with Matcha-TTS under
`third_party/`), installs its requirements, and names the clone in `src_dir`.
Nothing of it (or torch) is imported before `load()`, so the rest of Chorus runs
and tests without either (see `cosyvoice2_upstream`). The tests run this adapter
against the unmodified upstream code with random weights (`cosyvoice2_dummy`).

Concurrency: every call works on its own shallow copy of an instance's upstream
objects (`cosyvoice2_calls`): the weights are shared, upstream's per-stream state is
not. Several calls then run at once on one instance (`max_concurrent_streams` is
None); the real code's tests check it (first chunks, lengths, no state left). `slots`
loads that many instances (each a full copy of the weights) and spreads calls over
them, least busy first. In vLLM mode there is exactly one instance, because each
vLLM engine reserves its own share of GPU memory; upstream's vLLM path batches the
LLM steps of concurrent calls.

Cancel: closing the output generator stops upstream's LLM thread at its next token
and waits for it, so a cancelled or failed call leaves nothing running or stored.

Voices: `add_zero_shot_spk` computes the prompt once, but keeps it in one dict per
instance (`frontend.spk2info`) that every tenant would share. The adapter only
borrows that dict: prepare_voice moves the entry out into the PreparedVoice (as
numpy arrays owned by that voice), and each synthesis installs a fresh copy under a
per-call id and removes it afterwards.

Modes: with an instruction, `inference_instruct2` (the instruction ends with
`<|endofprompt|>`, as CosyVoice2 was trained); else, with a transcript,
`inference_zero_shot` (the LLM continues the reference's text and speech tokens, so
prosody follows the reference closely); a voice without transcript uses
`inference_cross_lingual`, which drops the reference's text and speech tokens from
the LLM prompt and keeps only the speaker embedding and acoustic prompt: timbre is
cloned, prosody less so, and the reference may be in another language than the text.

Speed: upstream streams only at speed 1.0 (while streaming it silently ignores any
other speed). At other speeds the adapter synthesizes without streaming, so audio
arrives in one chunk per upstream text segment (sentences merged up to ~80 tokens)
(`supports_streaming_speed = False`).
"""

from __future__ import annotations

import io
import json
import logging
import os
import tempfile
import threading
import uuid
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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
    VoiceRequired,
)
from synthesis.engines.base import (
    EngineInfo,
    PreparedVoice,
    ReferenceAudio,
    Samples,
    check_speed,
)
from synthesis.engines.cosyvoice2_calls import Stop, UpstreamCall
from synthesis.engines.cosyvoice2_input import check_instruction, check_text, instruct_prompt
from synthesis.engines.cosyvoice2_upstream import import_cosyvoice2

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
# Warm-up: a second of tone as the voice, a word to say (the first call is ~2x slower).
_WARMUP_TEXT = "Hi."
_INSTALL_HINT = (
    "clone FunAudioLLM/CosyVoice with --recursive, install its requirements.txt into this "
    "environment, and set COSYVOICE_SRC (the engine's src_dir option) to the clone; the "
    "PyPI package named 'cosyvoice' is unrelated and does not work"
)


@dataclass
class _Instance:
    """One loaded copy of the weights and the calls running on it."""

    index: int
    model: Any
    hop_len: int  # upstream's first-chunk hop, read before any call could change it
    active: int = 0


class CosyVoice2Engine:
    name = "cosyvoice2"
    supports_streaming_speed = False
    deterministic = False  # the LLM samples its speech tokens
    # Calls at once on one instance: unbounded, each call has its own upstream state.
    max_concurrent_streams: int | None = None
    follows_instructions = True  # instruct mode

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
        warmup: bool | str = True,
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
        self.warmup = _flag("warmup", warmup)
        self.sample_rate = SAMPLE_RATE  # replaced by what the loaded model reports
        self._instances: list[_Instance] = []
        self._changed = threading.Condition()  # an instance's `active` went down

    # --- lifecycle ------------------------------------------------------------------

    def load(self) -> None:
        if self._instances:
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
        self._instances = [
            _Instance(index, model, hop_len=int(getattr(model.model, "token_hop_len", 25)))
            for index, model in enumerate(models)
        ]
        if self.warmup:
            self._warm_up()

    def required_files(self) -> list[str]:
        """The files this configuration opens (the acceleration flags add their own)."""
        names = list(REQUIRED_FILES)
        if self.load_jit:
            names.append(f"flow.encoder.{'fp16' if self.fp16 else 'fp32'}.zip")
        if self.load_trt:
            # The TensorRT plan is built from this on first use, then cached beside it.
            names.append("flow.decoder.estimator.fp32.onnx")
        return names

    def _check_model_dir(self) -> None:
        missing = [name for name in self.required_files() if not (self.model_dir / name).is_file()]
        missing += [f"{name}/" for name in REQUIRED_FOLDERS if not (self.model_dir / name).is_dir()]
        if missing:
            raise EngineUnavailable(
                f"CosyVoice2 model folder {self.model_dir} is missing: {', '.join(missing)} "
                "(download CosyVoice2-0.5B there; COSYVOICE_MODEL_DIR names the folder)",
                details={"engine": self.name, "model_dir": str(self.model_dir), "missing": missing},
            )

    def _import_upstream(self) -> Any:
        if self.src_dir is not None and not self.src_dir.is_dir():
            raise EngineUnavailable(
                f"CosyVoice source folder {self.src_dir} does not exist; {_INSTALL_HINT}",
                details={"engine": self.name, "src_dir": str(self.src_dir)},
            )
        try:
            return import_cosyvoice2(self.src_dir)
        except (ImportError, AttributeError) as exc:
            raise EngineUnavailable(
                f"cannot import the CosyVoice runtime ({exc}); {_INSTALL_HINT}",
                details={"engine": self.name, "src_dir": str(self.src_dir or "")},
            ) from exc

    def _warm_up(self) -> None:
        """One short streamed call per instance: the first call pays for lazy setup."""
        rate = 24000
        t = np.arange(rate, dtype=np.float32) / rate
        tone = ReferenceAudio(
            samples=(0.2 * np.sin(2 * np.pi * 180 * t)).astype(np.float32),
            sample_rate=rate,
            transcript="Hello.",
        )
        for instance in self._instances:
            voice = self._prepare_on(instance, tone)
            for _ in self._synthesize_on(instance, _WARMUP_TEXT, voice, 1.0, ""):
                pass

    def close(self) -> None:
        # A call still running keeps its own reference to its model until it ends.
        instances, self._instances = self._instances, []
        for instance in instances:
            instance.model = None
        if instances:
            _free_device_memory()

    def info(self) -> EngineInfo:
        torch = _torch()
        if torch is not None and torch.cuda.is_available():
            device = f"cuda:{torch.cuda.current_device()}"
            memory = _device_memory(torch)
        else:
            device, memory = "cpu", 0
        return EngineInfo(
            name=self.name, sample_rate=self.sample_rate, device=device, memory_bytes=memory
        )

    def calibration_identity(self) -> dict[str, Any]:
        """What changes this configuration's curve (`synthesis.calibration.identity`);
        callable before `load()`, so nothing is put on the card to read it."""
        from synthesis.engines.fingerprint import files_fingerprint

        torch = _torch()
        versions = {"torch": getattr(torch, "__version__", "")}
        if torch is not None and torch.cuda.is_available():
            index = int(torch.cuda.current_device())
            card = str(torch.cuda.get_device_name(index))
            memory = int(torch.cuda.get_device_properties(index).total_memory)
            versions["cuda"] = str(torch.version.cuda)
        else:
            import platform

            import psutil

            card = f"cpu {platform.machine()} x{os.cpu_count()}"
            memory = int(psutil.virtual_memory().total)
        if self.src_dir is not None:
            versions["upstream"] = files_fingerprint(self.src_dir, ["cosyvoice"])
        return {
            "card": card,
            "memory_bytes": memory,
            "model": files_fingerprint(self.model_dir, [*self.required_files(), *REQUIRED_FOLDERS]),
            "flags": {
                "fp16": self.fp16,
                "load_jit": self.load_jit,
                "load_trt": self.load_trt,
                "load_vllm": self.load_vllm,
                "trt_concurrent": self.trt_concurrent,
                "slots": self.slots,
            },
            "versions": versions,
        }

    def device_memory(self) -> tuple[int, int] | None:
        """(used, total) bytes of the GPU, every process's share included; None on a CPU."""
        torch = _torch()
        if torch is None or not torch.cuda.is_available():
            return None
        free, total = torch.cuda.mem_get_info(int(torch.cuda.current_device()))
        return int(total - free), int(total)

    @contextmanager
    def _instance(self) -> Iterator[_Instance]:
        """The least busy instance (blocking while each has `max_concurrent_streams`)."""
        if not self._instances:
            raise EngineError("cosyvoice2 engine used before load() (or after close())")
        instances, limit = self._instances, self.max_concurrent_streams
        with self._changed:
            self._changed.wait_for(
                lambda: limit is None or any(i.active < limit for i in instances)
            )
            instance = min(instances, key=lambda i: i.active)
            instance.active += 1
        try:
            yield instance
        finally:
            with self._changed:
                instance.active -= 1
                self._changed.notify()

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
        with self._instance() as instance:
            return self._prepare_on(instance, reference)

    def _prepare_on(self, instance: _Instance, reference: ReferenceAudio) -> PreparedVoice:
        pcm = _to_pcm16(reference.samples)
        spk_id = f"chorus-prepare-{uuid.uuid4().hex}"
        with _wav_file(pcm, reference.sample_rate) as path:
            spk2info = instance.model.frontend.spk2info
            try:
                instance.model.add_zero_shot_spk(reference.transcript, path, spk_id)
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
        # Checked now, not at the first chunk; an instance is taken only once iterated,
        # so a stream that is never started holds nothing.
        if not self._instances:
            raise EngineError("cosyvoice2 engine used before load() (or after close())")
        check_speed(speed)
        if voice is None:
            raise VoiceRequired(
                "cosyvoice2 clones a voice: a reference voice is required",
                details={"engine": self.name},
            )
        self._check_voice(voice)
        check_text(text)
        check_instruction(instruction)
        return self._stream(text, voice, float(speed), instruction.strip())

    @property
    def streams_text(self) -> bool:
        # Upstream asserts that text-stream input is not used with vLLM.
        return not self.load_vllm

    def synthesize_text_stream(
        self, *, texts: Iterator[str], voice: PreparedVoice | None, instruction: str = ""
    ) -> Generator[Samples, None, None]:
        """Speak text as it is written: upstream's text-generator input (its LLM
        reads the pieces as they come, interleaving text and speech tokens, and
        starts speaking after a few). Upstream skips its text normalization for
        such input: numbers and symbols are read as written."""
        if not self._instances:
            raise EngineError("cosyvoice2 engine used before load() (or after close())")
        if not self.streams_text:
            raise EngineError(
                "cosyvoice2 with vLLM cannot take text as a stream", details={"engine": self.name}
            )
        if voice is None:
            raise VoiceRequired(
                "cosyvoice2 clones a voice: a reference voice is required",
                details={"engine": self.name},
            )
        self._check_voice(voice)
        check_instruction(instruction)
        # Upstream recognises text-stream input by its type: a generator.
        pieces = (piece for piece in texts if piece)
        return self._stream(pieces, voice, 1.0, instruction.strip())

    def _stream(
        self,
        text: str | Generator[str, None, None],
        voice: PreparedVoice,
        speed: float,
        instruction: str,
    ) -> Generator[Samples, None, None]:
        with self._instance() as instance:
            yield from self._synthesize_on(instance, text, voice, speed, instruction)

    def _synthesize_on(
        self,
        instance: _Instance,
        text: str | Generator[str, None, None],
        voice: PreparedVoice,
        speed: float,
        instruction: str,
    ) -> Generator[Samples, None, None]:
        stream = speed == 1.0  # while streaming, upstream ignores any other speed
        call = UpstreamCall(instance.model, hop_len=instance.hop_len)
        spk2info = call.front.frontend.spk2info  # shared by the instance's calls
        call_id = f"chorus-call-{uuid.uuid4().hex}"
        produced = False
        try:
            with _instruct_prompt(voice, instruction) as prompt_wav:
                outputs = self._start(
                    call.front, call_id, text, voice, instruction, prompt_wav, stream, speed
                )
                try:
                    for item in outputs:
                        produced = True
                        yield _to_samples(item["tts_speech"])
                finally:
                    outputs.close()  # at a yield: upstream's generator ends there
        except Stop:
            # Raised in upstream's loop after its LLM thread failed.
            error = call.error or RuntimeError("the LLM thread stopped")
            raise self._failure(error, f"synthesis on instance {instance.index}") from error
        except ChorusError:
            raise
        except Exception as exc:
            raise self._failure(exc, f"synthesis on instance {instance.index}") from exc
        finally:
            # Cancelled, failed or done: nothing of this call may outlive it.
            call.close()
            spk2info.pop(call_id, None)
        if call.error is not None:
            raise self._failure(call.error, f"synthesis on instance {instance.index}")
        if not produced:
            raise EngineError(
                "cosyvoice2 produced no audio for this text", details={"engine": self.name}
            )

    def _start(
        self,
        model: Any,
        call_id: str,
        text: str | Generator[str, None, None],
        voice: PreparedVoice,
        instruction: str,
        prompt_wav: str,
        stream: bool,
        speed: float,
    ) -> Generator[dict[str, Any], None, None]:
        """Pick the upstream mode for this voice and call; return its output generator."""
        if instruction:
            # No speaker id here: with one, upstream takes the LLM prompt text from the
            # stored entry (the transcript) and the instruction would be silently lost.
            return model.inference_instruct2(  # type: ignore[no-any-return]
                text, instruct_prompt(instruction), prompt_wav, stream=stream, speed=speed
            )
        # A fresh copy per call under its own id: some upstream versions delete keys
        # from the entry they are given (cross-lingual), and the dict is the instance's.
        model.frontend.spk2info[call_id] = {
            key: _to_tensor(value) for key, value in voice.data["prompt"].items()
        }
        if voice.data["prompt_text"]:
            return model.inference_zero_shot(  # type: ignore[no-any-return]
                text,
                voice.data["prompt_text"],
                "",  # ignored by upstream when zero_shot_spk_id is given
                zero_shot_spk_id=call_id,
                stream=stream,
                speed=speed,
            )
        return model.inference_cross_lingual(  # type: ignore[no-any-return]
            text, "", zero_shot_spk_id=call_id, stream=stream, speed=speed
        )

    def _failure(self, exc: BaseException, doing: str) -> EngineError:
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


def _device_memory(torch: Any) -> int:
    """GPU memory this process holds, vLLM, TensorRT and ONNX Runtime included.

    torch's allocator counts only its own tensors; NVML sees the whole process. Where
    NVML cannot match this process (not installed, or another PID namespace), the
    device's used memory is reported: it includes other processes on that GPU.
    """
    index = int(torch.cuda.current_device())
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if process.pid == os.getpid() and process.usedGpuMemory:
                return int(process.usedGpuMemory)
    except Exception:  # NVML is optional; any failure falls back to torch
        pass
    free, total = torch.cuda.mem_get_info(index)
    return int(total - free)


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
