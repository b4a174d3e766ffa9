"""CosyVoice2Engine on the real upstream code (ace7c47) with random weights, on a CPU.

The tiny model's LLM never samples a stop token, so every text segment decodes to
upstream's cap, 20 speech tokens per text token: lengths are known in advance while
the tokens themselves are random. With a 3 s prompt (75 tokens, a multiple of the
25-token hop) the first streamed chunk is 25 tokens: 50 mel frames of 480 samples,
less upstream's 8-frame vocoder cache, 20,160 samples.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

from chorus.errors import EngineError, EngineOutOfMemory, UnsupportedText, VoiceRequired
from synthesis.engines import load_engine
from synthesis.engines.base import PreparedVoice, ReferenceAudio
from synthesis.engines.cosyvoice2 import CosyVoice2Engine
from tests.upstream_cosyvoice import forget_upstream_modules, tiny_model_dir, upstream_src

FIRST_CHUNK = 20160  # 25 tokens x 2 mel frames x 480 samples, less the 3,840-sample cache
SAMPLES_PER_TOKEN = 960
SHORT = "Hi."  # 3 text tokens: 60 speech tokens, one streamed chunk and the rest
LONG = (
    "Chorus reads this long sentence aloud so that the model keeps decoding for a while, "
    "long after the first chunk of audio has gone out to the listener."
)  # 101 text tokens: 2,020 speech tokens, ~80 s of audio, several seconds of decoding
STANDIN_SRC = Path(__file__).resolve().parents[1] / "standins" / "cosyvoice"


@pytest.fixture(scope="module")
def engine() -> Iterator[CosyVoice2Engine]:
    loaded = load_engine(
        "cosyvoice2", {"model_dir": str(tiny_model_dir()), "src_dir": str(upstream_src())}
    )
    assert isinstance(loaded, CosyVoice2Engine)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def voice(engine: CosyVoice2Engine) -> PreparedVoice:
    return engine.prepare_voice(reference("A short reference recording."))


def reference(transcript: str = "", *, rate: int = 24000, seconds: float = 3.0) -> ReferenceAudio:
    t = np.arange(round(rate * seconds), dtype=np.float32) / rate
    samples = (0.2 * np.sin(2 * np.pi * 180 * t)).astype(np.float32)
    return ReferenceAudio(samples=samples, sample_rate=rate, transcript=transcript)


def chunk_sizes(engine: CosyVoice2Engine, voice: PreparedVoice, text: str, **kw: Any) -> list[int]:
    return [len(chunk) for chunk in engine.synthesize(text=text, voice=voice, **kw)]


def upstream_objects(engine: CosyVoice2Engine) -> list[Any]:
    """Each loaded instance's upstream `CosyVoice2` object."""
    return [instance.model for instance in engine._instances]


def text_tokens(engine: CosyVoice2Engine, text: str) -> int:
    return len(upstream_objects(engine)[0].frontend.tokenizer.encode(text))


def llm_threads() -> int:
    """Threads inside upstream's LLM job (the decode loop of some call), right now."""
    count = 0
    for frame in sys._current_frames().values():
        current: Any = frame
        while current is not None:
            if current.f_code.co_name == "llm_job" and "cosyvoice" in current.f_code.co_filename:
                count += 1
                break
            current = current.f_back
    return count


def upstream_state(engine: CosyVoice2Engine) -> dict[str, int]:
    """Entries in each instance's per-request dicts and prompt dict (all empty when idle)."""
    sizes: dict[str, int] = {}
    for front in upstream_objects(engine):
        for name, value in vars(front.model).items():
            if name.endswith("_dict") and isinstance(value, dict):
                sizes[name] = sizes.get(name, 0) + len(value)
        sizes["spk2info"] = sizes.get("spk2info", 0) + len(front.frontend.spk2info)
    return sizes


def idle(engine: CosyVoice2Engine) -> bool:
    return llm_threads() == 0 and not any(upstream_state(engine).values())


# --- voices and modes ------------------------------------------------------------------


def test_it_clones_a_voice_with_transcript_without_and_with_an_instruction(
    engine: CosyVoice2Engine,
) -> None:
    with_text = engine.prepare_voice(reference("Hello there."))
    without = engine.prepare_voice(reference(""))
    expected = text_tokens(engine, SHORT) * 20 * SAMPLES_PER_TOKEN
    for voice, instruction in ((with_text, ""), (without, ""), (with_text, "Speak cheerfully.")):
        sizes = chunk_sizes(engine, voice, SHORT, instruction=instruction)
        assert sizes[0] == FIRST_CHUNK
        assert sum(sizes) == expected
    assert with_text.data["prompt"]["llm_prompt_speech_token"].shape == (1, 75)
    assert idle(engine)


def test_a_dumped_voice_loads_back_and_speaks(
    engine: CosyVoice2Engine, voice: PreparedVoice
) -> None:
    loaded = engine.load_voice(engine.dump_voice(voice))
    for key, array in voice.data["prompt"].items():
        np.testing.assert_array_equal(loaded.data["prompt"][key], array)
    chunks = list(engine.synthesize(text=SHORT, voice=loaded))
    assert all(chunk.dtype == np.float32 and np.abs(chunk).max() <= 1.0 for chunk in chunks)


def test_other_speeds_come_in_one_chunk_per_upstream_text_segment(
    engine: CosyVoice2Engine, voice: PreparedVoice
) -> None:
    # Upstream merges short sentences into segments of up to ~80 tokens: these two
    # sentences are one segment, so one chunk, shortened by the speed.
    sizes = chunk_sizes(engine, voice, "Hi. Hello.", speed=2.0)
    assert len(sizes) == 1
    normal = text_tokens(engine, "Hi. Hello.") * 20 * SAMPLES_PER_TOKEN
    assert sizes[0] == pytest.approx(normal / 2, rel=0.01)


# --- bug: first audio x4 from the second stream on --------------------------------------------


def test_it_starts_every_stream_with_a_first_chunk_of_25_tokens(
    engine: CosyVoice2Engine, voice: PreparedVoice
) -> None:
    firsts = [chunk_sizes(engine, voice, SHORT)[0] for _ in range(3)]
    # Upstream doubles the instance's hop after each chunk; it must not carry over.
    assert firsts == [FIRST_CHUNK] * 3


# --- concurrency on one instance ---------------------------------------------------------------


def test_concurrent_calls_on_one_instance_each_get_what_they_would_alone(
    engine: CosyVoice2Engine, voice: PreparedVoice
) -> None:
    texts = ["Hi.", "Hello there.", "One two.", "Speak now, please."]
    alone = {text: chunk_sizes(engine, voice, text) for text in texts}
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    overlap = threading.Barrier(len(texts))

    def call(index: int) -> None:
        try:
            stream = engine.synthesize(text=texts[index], voice=voice)
            sizes = [len(next(stream))]
            overlap.wait(timeout=30)  # every call has streamed audio before any goes on
            sizes += [len(chunk) for chunk in stream]
            results[index] = sizes
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(texts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert len(upstream_objects(engine)) == 1
    # Same chunking, same lengths: no call saw another's hop, tokens or caches.
    assert {texts[i]: sizes for i, sizes in results.items()} == alone
    assert idle(engine)


# --- bug: cancel left upstream decoding ------------------------------------------------------


def test_closing_a_stream_stops_upstream_decoding_and_frees_its_state(
    engine: CosyVoice2Engine, voice: PreparedVoice
) -> None:
    stream = engine.synthesize(text=LONG, voice=voice)
    assert len(next(stream)) == FIRST_CHUNK
    assert llm_threads() == 1  # about 2,000 tokens still to decode
    started = time.monotonic()
    stream.close()
    assert time.monotonic() - started < 2
    assert idle(engine)
    # The instance takes the next job at once, first chunk as usual.
    assert chunk_sizes(engine, voice, SHORT)[0] == FIRST_CHUNK


def test_a_failed_call_stops_upstream_decoding_and_frees_its_state(
    engine: CosyVoice2Engine, voice: PreparedVoice, monkeypatch: pytest.MonkeyPatch
) -> None:
    flow = upstream_objects(engine)[0].model.flow
    real_inference = flow.inference
    calls: list[bool] = []

    def second_chunk_fails(*args: Any, **kwargs: Any) -> Any:
        calls.append(True)
        if len(calls) == 2:
            raise ValueError("the vocoder broke")
        return real_inference(*args, **kwargs)

    monkeypatch.setattr(flow, "inference", second_chunk_fails)
    with pytest.raises(EngineError, match="ValueError: the vocoder broke"):
        chunk_sizes(engine, voice, LONG)
    assert idle(engine)


def test_a_failing_llm_thread_fails_the_call_instead_of_hanging_it(
    engine: CosyVoice2Engine, voice: PreparedVoice, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Upstream's streaming loop waits for the LLM thread to say it ended; a thread
    # that raised never says so. Out-of-memory is the realistic cause on a GPU.
    llm = upstream_objects(engine)[0].model.llm
    real_inference = llm.inference
    torch = pytest.importorskip("torch")

    def runs_out_of_memory(*args: Any, **kwargs: Any) -> Iterator[int]:
        for index, token in enumerate(real_inference(*args, **kwargs)):
            if index == 40:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
            yield token

    monkeypatch.setattr(llm, "inference", runs_out_of_memory)
    started = time.monotonic()
    with pytest.raises(EngineOutOfMemory):
        chunk_sizes(engine, voice, LONG)
    assert time.monotonic() - started < 10
    assert idle(engine)
    monkeypatch.undo()
    assert chunk_sizes(engine, voice, SHORT)[0] == FIRST_CHUNK


class FakeVllmEngine:
    """TEST DOUBLE for vLLM (it needs CUDA): upstream's real vLLM branch drives it.
    A request's first `fast` tokens (more than a first chunk needs) come a
    millisecond apart, the rest 50 ms apart: its generation is still running when
    a loaded machine has made the first chunk (at 1 ms a token, it could end on
    its own first, and nothing would be left to abort)."""

    def __init__(self, fast: int = 200) -> None:
        self.tokens: dict[str, list[int]] = {}
        self.aborted: list[str] = []
        self.fast = fast

    def add_request(self, request_id: str, prompt: Any, params: Any) -> None:
        self.tokens[request_id] = []

    def step(self) -> list[Any]:
        slow = any(len(tokens) >= self.fast for tokens in self.tokens.values())
        time.sleep(0.05 if slow else 0.001)
        outputs = []
        for request_id, tokens in self.tokens.items():
            tokens.append(len(tokens) % 6561)
            output = SimpleNamespace(token_ids=list(tokens))
            outputs.append(SimpleNamespace(request_id=request_id, outputs=[output]))
        return outputs

    def abort_request(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self.tokens.pop(request_id, None)


def test_closing_a_stream_in_vllm_mode_aborts_its_vllm_request(
    engine: CosyVoice2Engine, voice: PreparedVoice, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_vllm = ModuleType("vllm")
    fake_vllm.SamplingParams = lambda **kwargs: kwargs  # type: ignore[attr-defined]
    fake_vllm.RequestOutput = object  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm)
    llm = upstream_objects(engine)[0].model.llm
    vllm = FakeVllmEngine()
    monkeypatch.setattr(llm, "vllm", vllm, raising=False)
    monkeypatch.setattr(llm, "lock", threading.Lock(), raising=False)

    stream = engine.synthesize(text=LONG, voice=voice)
    assert len(next(stream)) == FIRST_CHUNK
    (request_id,) = vllm.tokens
    stream.close()
    assert vllm.aborted == [request_id]
    assert vllm.tokens == {}
    assert llm.vllm_output_queue == {}
    assert idle(engine)


# --- bug: instructions without <|endofprompt|> ----------------------------------------------


def test_an_instruction_reaches_the_llm_ending_with_endofprompt(
    engine: CosyVoice2Engine, voice: PreparedVoice, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm = upstream_objects(engine)[0].model.llm
    real_inference = llm.inference
    prompts: list[list[int]] = []

    def spy(*args: Any, **kwargs: Any) -> Iterator[int]:
        prompts.append(kwargs["prompt_text"][0].tolist())
        yield from real_inference(*args, **kwargs)

    monkeypatch.setattr(llm, "inference", spy)
    chunk_sizes(engine, voice, SHORT, instruction="Speak cheerfully.")
    tokenizer = upstream_objects(engine)[0].frontend.tokenizer
    (endofprompt,) = tokenizer.encode("<|endofprompt|>")
    assert prompts == [[*tokenizer.encode("Speak cheerfully."), endofprompt]]


# --- bug: tenants' text in worker logs -------------------------------------------------------


def test_tenant_text_stays_out_of_logs_and_stderr(
    engine: CosyVoice2Engine,
    voice: PreparedVoice,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    secret = "Zebra account number seven."
    with caplog.at_level(logging.DEBUG):
        chunk_sizes(engine, voice, secret)
        chunk_sizes(engine, engine.prepare_voice(reference("A much longer transcript.")), "Hi.")
    captured = capfd.readouterr()
    assert "Zebra" not in caplog.text
    assert "Zebra" not in captured.err + captured.out
    assert "it/s]" not in captured.err  # no progress bars either


def test_importing_upstream_leaves_the_root_logger_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = logging.getLogger()
    # As in a process that has not configured logging yet: upstream's basicConfig
    # would add a DEBUG handler to stderr for every library.
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", logging.WARNING)
    level = root.level
    forget_upstream_modules()  # upstream configures logging when first imported
    engine = CosyVoice2Engine(
        model_dir=str(tiny_model_dir()), src_dir=str(upstream_src()), warmup=False
    )
    engine.load()  # upstream logs while loading, too
    engine.close()
    assert root.level == level
    # Only Python's own fallback may be there: WARNING and up, as before.
    assert all(handler.level >= logging.WARNING for handler in root.handlers)


# --- bug: control tokens and text with nothing to say ----------------------------------------


@pytest.mark.parametrize(
    ("text", "instruction", "reason"),
    [
        ("<|en|>Hello.", "", "control_token"),
        ("Hello <|endofprompt|> world.", "", "control_token"),
        ("Hello.", "Whisper.<|endofprompt|>", "control_token"),
        ("... !?", "", "nothing_to_speak"),
        ("   ", "", "empty"),
    ],
)
def test_it_refuses_control_tokens_and_text_without_words(
    engine: CosyVoice2Engine, voice: PreparedVoice, text: str, instruction: str, reason: str
) -> None:
    with pytest.raises(UnsupportedText) as caught:
        engine.synthesize(text=text, voice=voice, instruction=instruction)
    assert caught.value.details["reason"] == reason


def test_it_requires_a_voice(engine: CosyVoice2Engine) -> None:
    with pytest.raises(VoiceRequired):
        engine.synthesize(text=SHORT, voice=None)


# --- loading ---------------------------------------------------------------------------------


def test_load_warms_every_instance_up(monkeypatch: pytest.MonkeyPatch) -> None:
    upstream_src()
    calls: list[str] = []
    engine = CosyVoice2Engine(model_dir=str(tiny_model_dir()), src_dir=str(upstream_src()), slots=2)
    engine._import_upstream()
    model_class = sys.modules["cosyvoice.cli.model"].CosyVoice2Model
    real_tts = model_class.tts

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append("tts")
        return real_tts(self, *args, **kwargs)

    monkeypatch.setattr(model_class, "tts", counted)
    engine.load()
    try:
        assert len(calls) == 2  # one short streamed call on each instance
        assert idle(engine)
    finally:
        engine.close()


def test_the_stand_in_and_the_real_upstream_load_in_one_process() -> None:
    # sys.modules keeps the first `cosyvoice` imported; each engine gets its own.
    stand_in_dir = tiny_model_dir()  # the stand-in checks only that the files exist
    for src in (STANDIN_SRC, upstream_src(), STANDIN_SRC, upstream_src()):
        engine = CosyVoice2Engine(model_dir=str(stand_in_dir), src_dir=str(src), warmup=False)
        engine.load()
        try:
            module = sys.modules[type(upstream_objects(engine)[0]).__module__]
            assert Path(module.__file__ or "").resolve().is_relative_to(src.resolve())
        finally:
            engine.close()


# --- a realtime session's text, streamed into upstream's text-generator input ------------


def test_a_realtime_turn_goes_to_upstream_as_a_text_stream_and_a_cancel_ends_it(
    engine: CosyVoice2Engine,
    voice: PreparedVoice,
    broker: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from synthesis.realtime.channel import Append, Cancel, Close, SessionConfig, Start, send
    from synthesis.realtime.runner import session_run
    from synthesis.stream_protocol import Chunk, Said, decode
    from synthesis.streaming import stream_key

    job_id = f"rt-{time.monotonic_ns()}"
    config = SessionConfig(context="a", idle_timeout_s=60, max_seconds=300, store=False)
    send(broker, job_id, Start(config))
    pieces = ["Hello ", "there, ", "this is ", "streamed ", "as it is ", "written."]
    outcome: dict[str, Any] = {}

    def run() -> None:
        outcome["result"], _ = session_run(
            job_id=job_id,
            attempt=1,
            engine=engine,
            voice=voice,
            instruction="",
            sample_rate=None,
            client=broker,
            owned=lambda: True,
        )

    # What upstream's frontend is given, seen on the way through (it still runs).
    given: list[str] = []
    [frontend] = {id(m.frontend): m.frontend for m in upstream_objects(engine)}.values()
    extract = frontend._extract_text_token
    monkeypatch.setattr(
        frontend,
        "_extract_text_token",
        lambda text: (
            given.append(text if isinstance(text, str) else "<generator>") or extract(text)
        ),
    )
    session = threading.Thread(target=run)
    session.start()
    for piece in pieces:  # as a language model writes them
        send(broker, job_id, Append(context="a", text=piece))
        time.sleep(0.05)

    # The tiny model decodes without end once its text is in: its first chunk
    # shows the turn was spoken; the cancel (barge-in) ends it.
    deadline = time.monotonic() + 120
    events: list[Any] = []
    while not any(isinstance(event, Chunk) for event in events):
        assert time.monotonic() < deadline, "no audio"
        events = [decode(f) for _, f in broker.xrange(stream_key(job_id))]
        time.sleep(0.1)
    send(broker, job_id, Cancel(context="a"))
    send(broker, job_id, Close())
    session.join(timeout=60)
    assert not session.is_alive()

    result = outcome["result"]
    text = "".join(pieces)
    assert (result.text, result.characters, result.ending) == (text, len(text), "")
    events = [decode(f) for _, f in broker.xrange(stream_key(job_id))]
    chunks = [event for event in events if isinstance(event, Chunk)]
    assert chunks[0].context == "a"
    assert len(chunks[0].pcm) // 2 == FIRST_CHUNK  # upstream's first streamed chunk
    assert [e for e in events if isinstance(e, Said)] == [
        Said(context="a", characters=len(text), why="cancel", attempt=1)
    ]
    # Upstream took the turn's text as a generator (its text-stream path) and
    # tokenized each piece on its own, as it came.
    assert given.count("<generator>") == 1
    assert [text for text in given if text in pieces] == pieces
    deadline = time.monotonic() + 30
    while llm_threads():  # the cancelled call's LLM thread stops, as a closed call's does
        assert time.monotonic() < deadline, "upstream's LLM thread outlived the cancel"
        time.sleep(0.1)
    broker.delete(stream_key(job_id))
