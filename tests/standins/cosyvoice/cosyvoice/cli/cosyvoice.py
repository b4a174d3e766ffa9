"""STAND-IN FOR TESTS: this is not the real CosyVoice2 model and makes no speech.

It imitates the documented API surface of upstream `cosyvoice.cli.cosyvoice.CosyVoice2`
(FunAudioLLM/CosyVoice) so the `cosyvoice2` engine adapter can be tested on machines
without torch, a GPU or the weights: the constructor flags, `sample_rate`, the three
inference generators, `add_zero_shot_spk` with its shared `frontend.spk2info` dict,
the prompt checks (soundfile, at least 16 kHz, at most 30 s), one item per text
segment without streaming and several with it, and the assertion on speed with
streaming. Written from the documented behaviour, not from upstream code.

It also reproduces two upstream quirks the adapter must survive:
* a call with `zero_shot_spk_id` takes the prompt text from the stored entry, so
  `inference_instruct2` with an id ignores its `instruct_text`;
* streaming mutates a field shared by every call on the instance (`token_hop_len`),
  so overlapping calls on one instance show up in `first_hops` and `max_active`.

Test hooks: `CosyVoice2.instances` (every instance built), `calls` (what reached the
"model" per call), `fail_next` (an exception raised by the next inference).
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from collections.abc import Generator
from typing import Any, ClassVar

import numpy as np
import soundfile

TOKEN_MIN_HOP_LEN = 25
TOKEN_MAX_HOP_LEN = 100
EMBEDDING_DIM = 192
TOKENS_PER_SECOND = 25


class FakeTensor:
    """The little of torch.Tensor the adapter touches: `.cpu().numpy()` and `.shape`."""

    def __init__(self, array: Any) -> None:
        self._array = np.asarray(array)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._array.shape)

    def cpu(self) -> FakeTensor:
        return self

    def numpy(self) -> np.ndarray:
        return self._array


def as_array(value: Any) -> np.ndarray:
    """Entries may hold FakeTensors, torch tensors or numpy arrays (the adapter's choice)."""
    if hasattr(value, "cpu"):
        return np.asarray(value.cpu().numpy())
    return np.asarray(value)


def _load_wav(prompt_wav: Any) -> tuple[np.ndarray, int]:
    speech, rate = soundfile.read(prompt_wav, dtype="float32", always_2d=True)
    speech = speech.mean(axis=1)
    assert rate >= 16000, f"wav sample rate {rate} must be greater than 16000"
    assert len(speech) / rate <= 30, "do not support extract speech token for audio longer than 30s"
    return speech, rate


def _segments(text: str) -> list[str]:
    return [part for part in re.split(r"(?<=[.!?])\s+", text.strip()) if part]


class _FrontEnd:
    def __init__(self) -> None:
        self.spk2info: dict[str, dict[str, Any]] = {}


class CosyVoice2:
    instances: ClassVar[list[CosyVoice2]] = []
    chunk_delay_s: ClassVar[float] = 0.002
    chunks_per_segment: ClassVar[int] = 3
    samples_per_char: ClassVar[int] = 240

    def __init__(
        self,
        model_dir: str,
        load_jit: bool = False,
        load_trt: bool = False,
        load_vllm: bool = False,
        fp16: bool = False,
        trt_concurrent: int = 1,
    ) -> None:
        if not os.path.exists(os.path.join(model_dir, "cosyvoice2.yaml")):
            raise ValueError(f"{model_dir}/cosyvoice2.yaml not found!")
        self.model_dir = model_dir
        self.options = {
            "load_jit": load_jit,
            "load_trt": load_trt,
            "load_vllm": load_vllm,
            "fp16": fp16,
            "trt_concurrent": trt_concurrent,
        }
        self.sample_rate = 24000
        self.frontend = _FrontEnd()
        self.token_hop_len = TOKEN_MIN_HOP_LEN  # shared by every call: the upstream race
        self.calls: list[dict[str, Any]] = []
        self.first_hops: list[int] = []
        self.active = 0
        self.max_active = 0
        self.fail_next: BaseException | None = None
        self._state_lock = threading.Lock()
        CosyVoice2.instances.append(self)

    # --- speaker prompts --------------------------------------------------------

    def list_available_spks(self) -> list[str]:
        return list(self.frontend.spk2info.keys())

    def add_zero_shot_spk(self, prompt_text: str, prompt_wav: Any, zero_shot_spk_id: str) -> bool:
        assert zero_shot_spk_id != "", "do not use empty zero_shot_spk_id"
        self.frontend.spk2info[zero_shot_spk_id] = self._extract_prompt(prompt_text, prompt_wav)
        return True

    def save_spkinfo(self) -> None:
        # Upstream torch.saves the whole dict here; a marker is enough to detect a call.
        with open(os.path.join(self.model_dir, "spk2info.pt"), "w") as marker:
            marker.write("\n".join(self.frontend.spk2info))

    def _extract_prompt(self, prompt_text: str, prompt_wav: Any) -> dict[str, Any]:
        speech, rate = _load_wav(prompt_wav)
        digest = hashlib.sha256(speech.tobytes() + str(rate).encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "big"))
        n_tokens = max(1, round(len(speech) / rate * TOKENS_PER_SECOND))
        text_tokens = np.frombuffer(prompt_text.encode(), dtype=np.uint8).astype(np.int32)
        speech_tokens = rng.integers(0, 6561, size=(1, n_tokens), dtype=np.int32)
        embedding = rng.standard_normal((1, EMBEDDING_DIM)).astype(np.float32)
        return {
            "prompt_text": FakeTensor(text_tokens[None, :]),
            "prompt_text_len": FakeTensor(np.array([len(text_tokens)], dtype=np.int32)),
            "llm_prompt_speech_token": FakeTensor(speech_tokens),
            "llm_prompt_speech_token_len": FakeTensor(np.array([n_tokens], dtype=np.int32)),
            "flow_prompt_speech_token": FakeTensor(speech_tokens),
            "flow_prompt_speech_token_len": FakeTensor(np.array([n_tokens], dtype=np.int32)),
            "prompt_speech_feat": FakeTensor(np.zeros((1, 2 * n_tokens, 80), dtype=np.float32)),
            "prompt_speech_feat_len": FakeTensor(np.array([2 * n_tokens], dtype=np.int32)),
            "llm_embedding": FakeTensor(embedding),
            "flow_embedding": FakeTensor(embedding),
        }

    def _model_input(self, prompt_text: str, prompt_wav: Any, spk_id: str) -> dict[str, Any]:
        if spk_id == "":
            return self._extract_prompt(prompt_text, prompt_wav)
        # As upstream: with an id, the stored entry (its prompt text included) is used.
        return {**self.frontend.spk2info[spk_id]}

    # --- inference ----------------------------------------------------------------

    def inference_zero_shot(
        self,
        tts_text: str,
        prompt_text: str,
        prompt_wav: Any,
        zero_shot_spk_id: str = "",
        stream: bool = False,
        speed: float = 1.0,
        text_frontend: bool = True,
    ) -> Generator[dict[str, Any], None, None]:
        for segment in _segments(tts_text):
            model_input = self._model_input(prompt_text, prompt_wav, zero_shot_spk_id)
            yield from self._tts("zero_shot", segment, model_input, zero_shot_spk_id, stream, speed)

    def inference_cross_lingual(
        self,
        tts_text: str,
        prompt_wav: Any,
        zero_shot_spk_id: str = "",
        stream: bool = False,
        speed: float = 1.0,
        text_frontend: bool = True,
    ) -> Generator[dict[str, Any], None, None]:
        for segment in _segments(tts_text):
            model_input = self._model_input("", prompt_wav, zero_shot_spk_id)
            for key in ("prompt_text", "prompt_text_len"):
                del model_input[key]
            for key in ("llm_prompt_speech_token", "llm_prompt_speech_token_len"):
                del model_input[key]
            yield from self._tts(
                "cross_lingual", segment, model_input, zero_shot_spk_id, stream, speed
            )

    def inference_instruct2(
        self,
        tts_text: str,
        instruct_text: str,
        prompt_wav: Any,
        zero_shot_spk_id: str = "",
        stream: bool = False,
        speed: float = 1.0,
        text_frontend: bool = True,
    ) -> Generator[dict[str, Any], None, None]:
        for segment in _segments(tts_text):
            model_input = self._model_input(instruct_text, prompt_wav, zero_shot_spk_id)
            for key in ("llm_prompt_speech_token", "llm_prompt_speech_token_len"):
                del model_input[key]
            yield from self._tts("instruct2", segment, model_input, zero_shot_spk_id, stream, speed)

    def _tts(
        self,
        mode: str,
        segment: str,
        model_input: dict[str, Any],
        spk_id: str,
        stream: bool,
        speed: float,
    ) -> Generator[dict[str, Any], None, None]:
        assert not (stream and speed != 1.0), "speed change only support non-stream inference mode"
        embedding = as_array(model_input["flow_embedding"])
        prompt = model_input.get("prompt_text")
        self.calls.append(
            {
                "mode": mode,
                "text": segment,
                "llm_prompt_text": None
                if prompt is None
                else as_array(prompt).astype(np.uint8).tobytes().decode(),
                "llm_prompt_speech": "llm_prompt_speech_token" in model_input,
                "spk_id": spk_id,
                "stream": stream,
                "speed": speed,
                "embedding": embedding.copy(),
            }
        )
        with self._state_lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            if self.fail_next is not None:
                failure, self.fail_next = self.fail_next, None
                raise failure
            audio = self._audio(segment, embedding, speed)
            if not stream:
                time.sleep(self.chunk_delay_s)
                yield {"tts_speech": FakeTensor(audio[None, :])}
                return
            self.first_hops.append(self.token_hop_len)
            for piece in np.array_split(audio, self.chunks_per_segment):
                time.sleep(self.chunk_delay_s)
                # Like upstream: the hop grows on the instance, not per call.
                self.token_hop_len = min(TOKEN_MAX_HOP_LEN, self.token_hop_len * 2)
                yield {"tts_speech": FakeTensor(piece[None, :])}
            self.token_hop_len = TOKEN_MIN_HOP_LEN
        finally:
            with self._state_lock:
                self.active -= 1

    def _audio(self, segment: str, embedding: np.ndarray, speed: float) -> np.ndarray:
        """A tone fixed by text and speaker embedding: same inputs, same samples."""
        digest = hashlib.sha256(segment.encode() + embedding.tobytes()).digest()
        hz = 200.0 + int.from_bytes(digest[:4], "big") % 600
        n = max(self.chunks_per_segment, round(len(segment) * self.samples_per_char / speed))
        t = np.arange(n, dtype=np.float32) / self.sample_rate
        return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)
