"""One synthesis call's private view of a shared upstream CosyVoice2 instance.

Upstream keeps per-stream state on the model instance that every call shares:
- `token_hop_len` doubles after each streamed chunk (25 -> 50 -> 100 tokens) and is
  never reset, so from the second stream on an instance every first chunk waited for
  100+ tokens (~4 s of audio), and two streams on one instance changed each other's hop;
- per-request dicts keyed by a uuid (`tts_speech_token_dict`, `llm_end_dict`,
  `hift_cache_dict`) whose entries are removed only when a request runs to its end;
- each text segment's LLM runs in a thread of its own that decodes until a stop token
  or the length cap (20 speech tokens per text token), whether or not anybody still
  reads its tokens: closing the output generator early leaves it running.

A call therefore works on a shallow copy of the `CosyVoice2` object and of its
`model`: weights, frontend and device contexts are shared; the streaming fields and
the per-request dicts are the call's own, start fresh and go away with it. The
copy's `llm_job` runs upstream's inside a wrapper that records a failure, and the
call's token dict raises `Stop` at the LLM thread's next token once the call is
closed or has failed (the thread then ends; in vLLM mode its request is aborted).
`close()` waits for the thread, so an instance is idle when a cancelled call returns.
"""

from __future__ import annotations

import copy
import logging
import threading
from typing import Any

log = logging.getLogger(__name__)

# A decode step is milliseconds on a GPU; this bounds a step stuck in the device.
STOP_TIMEOUT_S = 30.0
_TOKENS = "tts_speech_token_dict"


class Stop(Exception):
    """Raised inside upstream at its next token read once the call stops."""


class _Tokens(dict[str, list[int]]):
    """The call's speech-token lists; every read raises `Stop` once the call stops."""

    def __init__(self, call: UpstreamCall) -> None:
        super().__init__()
        self._call = call

    def __getitem__(self, key: str) -> list[int]:
        if self._call.stopping:
            raise Stop()
        return super().__getitem__(key)


class UpstreamCall:
    """`front` is the call's copy of the upstream `CosyVoice2`; use it, then `close()`."""

    def __init__(self, shared: Any, *, hop_len: int) -> None:
        model = copy.copy(shared.model)
        # Every per-request dict starts empty and belongs to this call alone.
        for name, value in list(vars(model).items()):
            if name.endswith("_dict") and isinstance(value, dict):
                setattr(model, name, {})
        setattr(model, _TOKENS, _Tokens(self))
        model.lock = threading.Lock()  # upstream's lock guards only those dicts
        model.token_hop_len = hop_len
        stream = getattr(model.llm_context, "stream", None)
        if stream is not None:
            # A CUDA StreamContext keeps the stream it replaced on itself: one per call,
            # on the same stream, so two LLM threads never restore each other's.
            model.llm_context = type(model.llm_context)(stream)
        upstream_llm_job = type(model).llm_job
        model.llm_job = lambda *args: self._llm_job(upstream_llm_job, model, *args)
        self.front = copy.copy(shared)
        self.front.model = model
        self.error: BaseException | None = None
        self.stopping = False
        self._running = 0
        self._idle = threading.Condition()

    def _llm_job(self, upstream_llm_job: Any, model: Any, *args: Any) -> None:
        """Upstream's LLM thread body (one per text segment), stoppable and accounted."""
        with self._idle:
            self._running += 1
        request_id = args[-1]
        try:
            upstream_llm_job(model, *args)
        except Stop:
            _abort_vllm(model, request_id)
        except BaseException as exc:  # reported by the call; upstream would poll forever
            self.error = exc
            self.stopping = True
        finally:
            with self._idle:
                self._running -= 1
                self._idle.notify_all()

    def close(self) -> None:
        """Stop upstream's work for this call and wait until its LLM thread has ended."""
        self.stopping = True
        with self._idle:
            if not self._idle.wait_for(lambda: self._running == 0, timeout=STOP_TIMEOUT_S):
                log.error("cosyvoice2: an LLM thread did not stop within %.0f s", STOP_TIMEOUT_S)

    @property
    def running(self) -> int:
        """LLM threads of this call still decoding."""
        return self._running


def _abort_vllm(model: Any, request_id: str) -> None:
    """In vLLM mode a stopped request must leave the shared vLLM engine too."""
    llm = model.llm
    engine = getattr(llm, "vllm", None)
    if engine is None:
        return
    # Under upstream's lock, so no `step()` delivers an output for it afterwards.
    with llm.lock:
        engine.abort_request(request_id)
        llm.vllm_output_queue.pop(request_id, None)
