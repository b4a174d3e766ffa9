"""CosyVoice2Engine against the upstream stand-in (tests/standins/cosyvoice): no torch, no GPU."""

from __future__ import annotations

import importlib
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

from chorus.errors import (
    AudioTooLong,
    EngineError,
    EngineOutOfMemory,
    EngineUnavailable,
    InvalidInput,
    SampleRateTooLow,
)
from synthesis.engines import cosyvoice2, load_engine
from synthesis.engines.base import Engine, PreparedVoice, ReferenceAudio
from synthesis.engines.cosyvoice2 import REQUIRED_FILES, CosyVoice2Engine
from synthesis.engines.synthetic import SyntheticEngine

STANDIN_SRC = Path(__file__).resolve().parents[1] / "standins" / "cosyvoice"
TWO_SENTENCES = "The first sentence is here. And here is the second one."
ALL_MISSING = [*REQUIRED_FILES, "CosyVoice-BlankEN/"]


@pytest.fixture(autouse=True)
def _isolated_import_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # load() puts src_dir on sys.path; give each test its own copy to change.
    monkeypatch.setattr(sys, "path", list(sys.path))


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "CosyVoice2-0.5B"
    (folder / "CosyVoice-BlankEN").mkdir(parents=True)
    for name in REQUIRED_FILES:
        (folder / name).touch()
    return folder


@pytest.fixture
def make(model_dir: Path) -> Iterator[Any]:
    engines: list[Engine] = []

    def build(**options: Any) -> CosyVoice2Engine:
        engine = load_engine(
            "cosyvoice2", {"model_dir": str(model_dir), "src_dir": str(STANDIN_SRC), **options}
        )
        assert isinstance(engine, CosyVoice2Engine)
        engines.append(engine)
        return engine

    yield build
    for engine in engines:
        engine.close()


@pytest.fixture
def upstream() -> Iterator[ModuleType]:
    """The stand-in module, with its record of instances cleared before and after."""
    sys.path.insert(0, str(STANDIN_SRC))
    module = importlib.import_module("cosyvoice.cli.cosyvoice")
    module.CosyVoice2.instances.clear()
    yield module
    module.CosyVoice2.instances.clear()


def reference(transcript: str = "", *, rate: int = 24000, seconds: float = 3.0) -> ReferenceAudio:
    t = np.arange(round(rate * seconds), dtype=np.float32) / rate
    samples = (0.2 * np.sin(2 * np.pi * 180 * t)).astype(np.float32)
    return ReferenceAudio(samples=samples, sample_rate=rate, transcript=transcript)


def speak(engine: CosyVoice2Engine, voice: PreparedVoice, text: str, **kw: Any) -> list[np.ndarray]:
    return list(engine.synthesize(text=text, voice=voice, **kw))


def spk2info_ids(upstream: ModuleType) -> list[str]:
    return [key for model in upstream.CosyVoice2.instances for key in model.frontend.spk2info]


# --- loading ------------------------------------------------------------------------------


def test_load_names_every_missing_file_before_importing_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "cosyvoice", None)  # an import would fail differently
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(EngineUnavailable) as caught:
        CosyVoice2Engine(model_dir=str(empty), src_dir=str(STANDIN_SRC)).load()
    assert caught.value.details["missing"] == ALL_MISSING
    for name in ALL_MISSING:
        assert name in caught.value.message

    (empty / "cosyvoice2.yaml").touch()
    (empty / "CosyVoice-BlankEN").touch()  # a file where a folder must be
    with pytest.raises(EngineUnavailable) as caught:
        CosyVoice2Engine(model_dir=str(empty)).load()
    assert caught.value.details["missing"] == [*REQUIRED_FILES[1:], "CosyVoice-BlankEN/"]


def test_a_missing_upstream_runtime_is_reported_with_what_to_do(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "cosyvoice", None)  # as if never installed
    with pytest.raises(EngineUnavailable, match="COSYVOICE_SRC") as caught:
        CosyVoice2Engine(model_dir=str(model_dir), src_dir=str(tmp_path)).load()
    assert "cannot import the CosyVoice runtime" in caught.value.message
    with pytest.raises(EngineUnavailable, match="does not exist"):
        CosyVoice2Engine(model_dir=str(model_dir), src_dir=str(tmp_path / "nope")).load()


@pytest.fixture
def no_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The adapter as it runs where torch is not installed (the stand-in needs none)."""
    monkeypatch.setattr(cosyvoice2, "_torch", lambda: None)


class FakeCuda:
    class OutOfMemoryError(RuntimeError):
        pass

    def __init__(self) -> None:
        self.emptied = 0

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return 1

    def memory_allocated(self) -> int:
        return 5 * 2**30

    def empty_cache(self) -> None:
        self.emptied += 1


def test_loads_with_its_options_and_reports_itself(
    make: Any, upstream: ModuleType, no_torch: None
) -> None:
    engine = make(fp16="true", load_jit=True, load_trt="1", trt_concurrent="2")
    assert isinstance(engine, Engine)
    assert engine.supports_streaming_speed is False
    info = engine.info()
    assert (info.name, info.sample_rate, info.device, info.memory_bytes) == (
        "cosyvoice2",
        24000,
        "cpu",
        0,
    )
    (model,) = upstream.CosyVoice2.instances
    assert model.options == {
        "load_jit": True,
        "load_trt": True,
        "load_vllm": False,
        "fp16": True,
        "trt_concurrent": 2,
    }


def test_registry_rejects_bad_options(model_dir: Path) -> None:
    with pytest.raises(EngineUnavailable, match="invalid options"):
        load_engine("cosyvoice2", {"model_dir": str(model_dir), "slots": 0})
    with pytest.raises(EngineUnavailable, match="invalid options"):
        load_engine("cosyvoice2", {"model_dir": str(model_dir), "fp16": "perhaps"})
    with pytest.raises(EngineUnavailable, match="invalid options"):
        load_engine("cosyvoice2", {})  # model_dir is required


# --- modes ---------------------------------------------------------------------------------


def test_a_voice_with_a_transcript_is_cloned_zero_shot(make: Any, upstream: ModuleType) -> None:
    engine = make()
    voice = engine.prepare_voice(reference("Hello, this is my voice."))
    speak(engine, voice, "Say this.")
    (model,) = upstream.CosyVoice2.instances
    call = model.calls[-1]
    assert call["mode"] == "zero_shot"
    assert call["llm_prompt_text"] == "Hello, this is my voice."
    assert call["llm_prompt_speech"] is True
    assert call["spk_id"].startswith("chorus-call-")
    assert (call["stream"], call["speed"]) == (True, 1.0)
    np.testing.assert_array_equal(call["embedding"], voice.data["prompt"]["flow_embedding"])


def test_a_voice_without_transcript_is_cloned_cross_lingually(
    make: Any, upstream: ModuleType
) -> None:
    engine = make()
    voice = engine.prepare_voice(reference(""))
    speak(engine, voice, "Say this.")
    call = upstream.CosyVoice2.instances[0].calls[-1]
    assert call["mode"] == "cross_lingual"
    assert call["llm_prompt_text"] is None  # only timbre and acoustics are prompted
    assert call["llm_prompt_speech"] is False
    assert call["spk_id"].startswith("chorus-call-")


def test_an_instruction_reaches_the_model_with_the_voice(make: Any, upstream: ModuleType) -> None:
    engine = make()
    voice = engine.prepare_voice(reference("Hello, this is my voice."))
    speak(engine, voice, "Say this.", instruction="Speak cheerfully.")
    call = upstream.CosyVoice2.instances[0].calls[-1]
    assert call["mode"] == "instruct2"
    # Not the transcript: upstream would substitute it if a speaker id were passed.
    assert call["llm_prompt_text"] == "Speak cheerfully."
    assert call["spk_id"] == ""
    np.testing.assert_array_equal(call["embedding"], voice.data["prompt"]["flow_embedding"])


def test_streaming_yields_several_float32_chunks_per_segment(
    make: Any, upstream: ModuleType
) -> None:
    engine = make()
    voice = engine.prepare_voice(reference("Hello."))
    chunks = speak(engine, voice, TWO_SENTENCES)
    per_segment = upstream.CosyVoice2.chunks_per_segment
    assert len(chunks) == 2 * per_segment
    assert all(c.dtype == np.float32 and c.ndim == 1 and len(c) > 0 for c in chunks)


def test_other_speeds_synthesize_without_streaming(make: Any, upstream: ModuleType) -> None:
    engine = make()
    voice = engine.prepare_voice(reference("Hello."))
    normal = np.concatenate(speak(engine, voice, TWO_SENTENCES))
    fast = speak(engine, voice, TWO_SENTENCES, speed=1.5)  # would assert if streamed
    assert len(fast) == 2  # one chunk per segment
    assert len(np.concatenate(fast)) == pytest.approx(len(normal) / 1.5, rel=0.01)
    call = upstream.CosyVoice2.instances[0].calls[-1]
    assert (call["stream"], call["speed"]) == (False, 1.5)


def test_rejects_bad_input(make: Any, upstream: ModuleType) -> None:
    engine = make()
    voice = engine.prepare_voice(reference("Hello."))
    with pytest.raises(InvalidInput):
        engine.synthesize(text="hi", voice=voice, speed=3.0)
    with pytest.raises(InvalidInput, match="reference voice is required"):
        engine.synthesize(text="hi", voice=None)
    with pytest.raises(InvalidInput, match="synthetic"):
        engine.synthesize(text="hi", voice=PreparedVoice(engine="synthetic", data={}))
    with pytest.raises(SampleRateTooLow):
        engine.prepare_voice(reference(rate=8000))
    with pytest.raises(AudioTooLong):
        engine.prepare_voice(reference(seconds=31))


def test_use_before_load_is_an_engine_error(model_dir: Path) -> None:
    engine = CosyVoice2Engine(model_dir=str(model_dir), src_dir=str(STANDIN_SRC))
    with pytest.raises(EngineError, match="before load"):
        engine.prepare_voice(reference())


# --- concurrency -------------------------------------------------------------------------


def run_threads(engine: CosyVoice2Engine, voice: PreparedVoice, count: int) -> list[int]:
    lengths: list[int] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            lengths.append(sum(len(c) for c in speak(engine, voice, TWO_SENTENCES)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors, errors
    return lengths


def test_calls_on_one_instance_never_overlap(
    make: Any, upstream: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upstream.CosyVoice2, "chunk_delay_s", 0.005)
    engine = make(slots=1)
    voice = engine.prepare_voice(reference("Hello."))
    lengths = run_threads(engine, voice, 8)
    assert len(lengths) == 8
    assert len(set(lengths)) == 1
    (model,) = upstream.CosyVoice2.instances
    assert model.max_active == 1
    # Every stream started from the minimum hop: no call saw another's inflated field.
    assert model.first_hops == [25] * 16
    assert spk2info_ids(upstream) == []


def test_a_second_call_waits_for_the_only_slot(make: Any, upstream: ModuleType) -> None:
    engine = make(slots=1)
    voice = engine.prepare_voice(reference("Hello."))
    first = engine.synthesize(text=TWO_SENTENCES, voice=voice)
    next(first)
    done = threading.Event()
    threading.Thread(target=lambda: (speak(engine, voice, "Later."), done.set())).start()
    assert not done.wait(0.2), "the second call ran while the first held the instance"
    first.close()  # an early close frees the slot and the per-call prompt
    assert done.wait(5)
    assert spk2info_ids(upstream) == []


def test_two_slots_serve_two_calls_at_once(make: Any, upstream: ModuleType) -> None:
    engine = make(slots=2)
    voice = engine.prepare_voice(reference("Hello."))
    first = engine.synthesize(text=TWO_SENTENCES, voice=voice)
    second = engine.synthesize(text=TWO_SENTENCES, voice=voice)
    next(first)
    next(second)  # would block forever with one slot
    models = upstream.CosyVoice2.instances
    assert len(models) == 2
    assert [m.active for m in models] == [1, 1]
    first.close()
    second.close()
    run_threads(engine, voice, 8)
    assert all(m.max_active == 1 for m in models)


def test_vllm_mode_loads_one_shared_instance(make: Any, upstream: ModuleType) -> None:
    engine = make(load_vllm=True, slots=3)
    voice = engine.prepare_voice(reference("Hello."))
    run_threads(engine, voice, 4)
    (model,) = upstream.CosyVoice2.instances
    assert model.options["load_vllm"] is True
    assert len(model.calls) == 8  # two segments for each of the four calls
    assert model.max_active == 1


# --- failures --------------------------------------------------------------------------------


def test_out_of_memory_is_reported_and_the_next_call_works(make: Any, upstream: ModuleType) -> None:
    engine = make()
    voice = engine.prepare_voice(reference("Hello."))
    (model,) = upstream.CosyVoice2.instances
    model.fail_next = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    with pytest.raises(EngineOutOfMemory, match="out of memory"):
        speak(engine, voice, TWO_SENTENCES)
    assert spk2info_ids(upstream) == []
    assert len(speak(engine, voice, TWO_SENTENCES)) == 6

    model.fail_next = ValueError("bad token")
    with pytest.raises(EngineError, match="ValueError: bad token"):
        speak(engine, voice, "Hi.")
    assert len(speak(engine, voice, "Hi.")) == 3


def test_a_cuda_out_of_memory_error_frees_the_cache(
    make: Any, upstream: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make()
    voice = engine.prepare_voice(reference("Hello."))
    cuda = FakeCuda()
    fake_torch = SimpleNamespace(cuda=cuda)
    monkeypatch.setattr(cosyvoice2, "_torch", lambda: fake_torch)
    monkeypatch.setattr(cosyvoice2, "_to_tensor", lambda array: array)  # no real torch here
    info = engine.info()
    assert (info.device, info.memory_bytes) == ("cuda:1", 5 * 2**30)
    upstream.CosyVoice2.instances[0].fail_next = FakeCuda.OutOfMemoryError("no room")
    with pytest.raises(EngineOutOfMemory):
        speak(engine, voice, "Hi.")
    assert cuda.emptied == 1
    assert len(speak(engine, voice, "Hi.")) == 3


# --- prepared voices -------------------------------------------------------------------------


def test_dumped_voice_loads_back_and_speaks_the_same(make: Any, upstream: ModuleType) -> None:
    engine = make()
    voice = engine.prepare_voice(reference("Hello, this is my voice."))
    data = engine.dump_voice(voice)
    assert isinstance(data, bytes)
    loaded = engine.load_voice(data)
    assert loaded.engine == "cosyvoice2"
    assert loaded.data["prompt_text"] == "Hello, this is my voice."
    assert loaded.data["reference_rate"] == 24000
    np.testing.assert_array_equal(loaded.data["reference"], voice.data["reference"])
    assert loaded.data["prompt"].keys() == voice.data["prompt"].keys()
    for key, array in voice.data["prompt"].items():
        np.testing.assert_array_equal(loaded.data["prompt"][key], array)
        assert loaded.data["prompt"][key].dtype == array.dtype
    np.testing.assert_array_equal(
        np.concatenate(speak(engine, loaded, TWO_SENTENCES)),
        np.concatenate(speak(engine, voice, TWO_SENTENCES)),
    )


def test_loading_foreign_or_damaged_data_is_an_engine_error(tmp_path: Path, make: Any) -> None:
    engine = make()
    with pytest.raises(EngineError):
        engine.load_voice(b"not an archive")
    synthetic = SyntheticEngine(state_dir=tmp_path)
    foreign = synthetic.dump_voice(PreparedVoice(engine="synthetic", data={"fingerprint": "x"}))
    with pytest.raises(EngineError):
        engine.load_voice(foreign)


def test_tenants_with_identical_audio_get_independent_voices(
    make: Any, upstream: ModuleType
) -> None:
    engine = make(slots=2)
    alice = engine.prepare_voice(reference("Same words."))
    bob = engine.prepare_voice(reference("Same words."))
    assert spk2info_ids(upstream) == []  # nothing left in the shared dicts
    assert alice.data is not bob.data
    for key, array in alice.data["prompt"].items():
        np.testing.assert_array_equal(array, bob.data["prompt"][key])
        assert not np.shares_memory(array, bob.data["prompt"][key])
    bob_audio = np.concatenate(speak(engine, bob, "Hello."))
    alice.data["prompt"]["flow_embedding"][:] = 0  # damage one: the other is unaffected
    np.testing.assert_array_equal(np.concatenate(speak(engine, bob, "Hello.")), bob_audio)
    assert spk2info_ids(upstream) == []


def test_voice_preparation_waits_for_a_free_instance(make: Any, upstream: ModuleType) -> None:
    engine = make(slots=1)
    voice = engine.prepare_voice(reference("Hello."))
    stream = engine.synthesize(text=TWO_SENTENCES, voice=voice)
    next(stream)
    prepared: list[PreparedVoice] = []
    worker = threading.Thread(target=lambda: prepared.append(engine.prepare_voice(reference())))
    worker.start()
    time.sleep(0.1)
    assert not prepared  # the instance's frontend is busy with the stream
    stream.close()
    worker.join(timeout=5)
    assert len(prepared) == 1
