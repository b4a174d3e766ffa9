"""STAND-IN FOR TESTS: this is not the real CosyVoice2 model and makes no speech.

The adapter is tested against the real upstream code (tests/synthesis/
test_cosyvoice2_upstream.py). This stand-in remains only for what the real code
cannot do on a CPU: upstream turns the acceleration flags (fp16, JIT, TensorRT,
vLLM) off when there is no CUDA device, and GPU out-of-memory cannot be produced
here. So it records the constructor's flags, can fail its constructor or its next
call with a given exception, and otherwise answers the few calls the adapter makes
(a voice prompt, one chunk of tone per call) with the shapes upstream uses.

Test hooks: `CosyVoice2.instances` (every instance built), `fail_init` (raised by
the next constructor), `fail_next` on an instance (raised by its next inference).
"""

from __future__ import annotations

import threading
from collections.abc import Generator
from contextlib import nullcontext
from typing import Any, ClassVar

import numpy as np

EMBEDDING_DIM = 192


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


class _FrontEnd:
    def __init__(self) -> None:
        self.spk2info: dict[str, dict[str, Any]] = {}


class _Model:
    """Upstream's CosyVoice2Model fields the adapter gives each call its own copy of."""

    def __init__(self) -> None:
        self.token_hop_len = 25
        self.llm_context = nullcontext()
        self.lock = threading.Lock()
        self.tts_speech_token_dict: dict[str, list[int]] = {}
        self.llm_end_dict: dict[str, bool] = {}
        self.hift_cache_dict: dict[str, Any] = {}

    def llm_job(self, *args: Any) -> None:
        raise AssertionError("the stand-in has no LLM")


class CosyVoice2:
    instances: ClassVar[list[CosyVoice2]] = []
    fail_init: ClassVar[BaseException | None] = None

    def __init__(
        self,
        model_dir: str,
        load_jit: bool = False,
        load_trt: bool = False,
        load_vllm: bool = False,
        fp16: bool = False,
        trt_concurrent: int = 1,
    ) -> None:
        if CosyVoice2.fail_init is not None:
            failure, CosyVoice2.fail_init = CosyVoice2.fail_init, None
            raise failure
        self.options = {
            "load_jit": load_jit,
            "load_trt": load_trt,
            "load_vllm": load_vllm,
            "fp16": fp16,
            "trt_concurrent": trt_concurrent,
        }
        self.sample_rate = 24000
        self.frontend = _FrontEnd()
        self.model = _Model()
        self.fail_next: BaseException | None = None
        CosyVoice2.instances.append(self)

    def add_zero_shot_spk(self, prompt_text: str, prompt_wav: Any, zero_shot_spk_id: str) -> bool:
        embedding = np.ones((1, EMBEDDING_DIM), dtype=np.float32)
        tokens = np.zeros((1, 75), dtype=np.int32)
        self.frontend.spk2info[zero_shot_spk_id] = {
            "prompt_text": FakeTensor(np.zeros((1, 3), dtype=np.int32)),
            "llm_prompt_speech_token": FakeTensor(tokens),
            "flow_prompt_speech_token": FakeTensor(tokens),
            "prompt_speech_feat": FakeTensor(np.zeros((1, 150, 80), dtype=np.float32)),
            "llm_embedding": FakeTensor(embedding),
            "flow_embedding": FakeTensor(embedding),
        }
        return True

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
        # Each call runs on the adapter's copy; the failure hook lives on the original.
        original = next(m for m in CosyVoice2.instances if m.frontend is self.frontend)
        if original.fail_next is not None:
            failure, original.fail_next = original.fail_next, None
            raise failure
        t = np.arange(4800, dtype=np.float32) / self.sample_rate
        yield {"tts_speech": FakeTensor((0.3 * np.sin(2 * np.pi * 220 * t))[None, :])}
