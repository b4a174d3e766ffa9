"""CosyVoice2Engine where the real upstream cannot run: no upstream at all, or on a GPU.

Everything upstream does on a CPU is tested against the real code in
test_cosyvoice2_upstream.py. Here: checks made before upstream is imported, and,
through the stand-in in tests/standins/cosyvoice, what needs CUDA (the acceleration
flags, which upstream turns off without CUDA; device memory; GPU out-of-memory).
"""

from __future__ import annotations

import sys
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
from tests.upstream_cosyvoice import forget_upstream_modules

STANDIN_SRC = Path(__file__).resolve().parents[1] / "standins" / "cosyvoice"
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
    """The stand-in module (not whatever `cosyvoice` an earlier test imported)."""
    forget_upstream_modules()
    sys.path.insert(0, str(STANDIN_SRC))
    from cosyvoice.cli import cosyvoice as module

    module.CosyVoice2.instances.clear()
    yield module
    module.CosyVoice2.instances.clear()
    forget_upstream_modules()


def reference(transcript: str = "", *, rate: int = 24000, seconds: float = 3.0) -> ReferenceAudio:
    t = np.arange(round(rate * seconds), dtype=np.float32) / rate
    samples = (0.2 * np.sin(2 * np.pi * 180 * t)).astype(np.float32)
    return ReferenceAudio(samples=samples, sample_rate=rate, transcript=transcript)


# --- before upstream is imported ----------------------------------------------------------


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


def test_the_files_the_acceleration_flags_open_are_checked_at_load(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "cosyvoice", None)
    with pytest.raises(EngineUnavailable) as caught:
        CosyVoice2Engine(model_dir=str(model_dir), load_jit=True, load_trt=True).load()
    assert caught.value.details["missing"] == [
        "flow.encoder.fp32.zip",
        "flow.decoder.estimator.fp32.onnx",
    ]
    with pytest.raises(EngineUnavailable) as caught:
        CosyVoice2Engine(model_dir=str(model_dir), load_jit=True, fp16=True).load()
    assert caught.value.details["missing"] == ["flow.encoder.fp16.zip"]


def test_a_missing_upstream_runtime_is_reported_with_what_to_do(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "cosyvoice", None)  # as if never installed
    with pytest.raises(EngineUnavailable, match="COSYVOICE_SRC") as caught:
        CosyVoice2Engine(model_dir=str(model_dir), src_dir=str(tmp_path)).load()
    assert "cannot import the CosyVoice runtime" in caught.value.message
    with pytest.raises(EngineUnavailable, match="does not exist"):
        CosyVoice2Engine(model_dir=str(model_dir), src_dir=str(tmp_path / "nope")).load()


def test_registry_rejects_bad_options(model_dir: Path) -> None:
    with pytest.raises(EngineUnavailable, match="invalid options"):
        load_engine("cosyvoice2", {"model_dir": str(model_dir), "slots": 0})
    with pytest.raises(EngineUnavailable, match="invalid options"):
        load_engine("cosyvoice2", {"model_dir": str(model_dir), "fp16": "perhaps"})
    with pytest.raises(EngineUnavailable, match="invalid options"):
        load_engine("cosyvoice2", {})  # model_dir is required


def test_use_before_load_is_an_engine_error(model_dir: Path) -> None:
    engine = CosyVoice2Engine(model_dir=str(model_dir), src_dir=str(STANDIN_SRC))
    with pytest.raises(EngineError, match="before load"):
        engine.prepare_voice(reference())


def test_reference_audio_is_checked_before_the_model(make: Any, upstream: ModuleType) -> None:
    engine = make()
    voice = engine.prepare_voice(reference("Hello."))
    with pytest.raises(InvalidInput):
        engine.synthesize(text="hi", voice=voice, speed=3.0)
    with pytest.raises(InvalidInput, match="synthetic"):
        engine.synthesize(text="hi", voice=PreparedVoice(engine="synthetic", data={}))
    with pytest.raises(SampleRateTooLow):
        engine.prepare_voice(reference(rate=8000))
    with pytest.raises(AudioTooLong):
        engine.prepare_voice(reference(seconds=31))


def test_loading_foreign_or_damaged_data_is_an_engine_error(
    tmp_path: Path, make: Any, upstream: ModuleType
) -> None:
    engine = make()
    with pytest.raises(EngineError):
        engine.load_voice(b"not an archive")
    synthetic = SyntheticEngine(state_dir=tmp_path)
    foreign = synthetic.dump_voice(PreparedVoice(engine="synthetic", data={"fingerprint": "x"}))
    with pytest.raises(EngineError):
        engine.load_voice(foreign)


# --- CUDA only (through the stand-in) ------------------------------------------------------


class FakeCuda:
    class OutOfMemoryError(RuntimeError):
        pass

    def __init__(self) -> None:
        self.emptied = 0

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return 1

    def mem_get_info(self, index: int) -> tuple[int, int]:
        return 3 * 2**30, 8 * 2**30

    def empty_cache(self) -> None:
        self.emptied += 1


def test_acceleration_flags_reach_upstream(make: Any, upstream: ModuleType) -> None:
    # Upstream turns these off without CUDA, so only the stand-in can show they arrive.
    engine = make(fp16="true", load_jit=False, load_trt="0", trt_concurrent="2")
    assert isinstance(engine, Engine)
    assert engine.supports_streaming_speed is False
    assert engine.max_concurrent_streams is None
    (model,) = upstream.CosyVoice2.instances
    assert model.options == {
        "load_jit": False,
        "load_trt": False,
        "load_vllm": False,
        "fp16": True,
        "trt_concurrent": 2,
    }
    info = engine.info()
    assert (info.name, info.sample_rate) == ("cosyvoice2", 24000)


def test_vllm_mode_loads_one_shared_instance(make: Any, upstream: ModuleType) -> None:
    engine = make(load_vllm=True, slots=3)
    (model,) = upstream.CosyVoice2.instances
    assert model.options["load_vllm"] is True
    assert len(engine._instances) == 1


def test_out_of_memory_while_loading_names_what_to_lower(make: Any, upstream: ModuleType) -> None:
    upstream.CosyVoice2.fail_init = FakeCuda.OutOfMemoryError("CUDA out of memory")
    with pytest.raises(EngineOutOfMemory, match="CHORUS_ENGINE_SLOTS"):
        make(slots=2)


def test_device_memory_counts_the_whole_process_and_an_oom_frees_the_cache(
    make: Any, upstream: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make(warmup=False)
    voice = engine.prepare_voice(reference("Hello."))
    cuda = FakeCuda()
    monkeypatch.setattr(cosyvoice2, "_torch", lambda: SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(cosyvoice2, "_to_tensor", lambda array: array)  # no real torch here
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML: the device's used memory
    info = engine.info()
    # Not torch's allocator alone: vLLM, TensorRT and ONNX Runtime allocate beside it.
    assert (info.device, info.memory_bytes) == ("cuda:1", 5 * 2**30)
    upstream.CosyVoice2.instances[0].fail_next = FakeCuda.OutOfMemoryError("no room")
    with pytest.raises(EngineOutOfMemory):
        list(engine.synthesize(text="Hi.", voice=voice))
    assert cuda.emptied == 1
    assert len(list(engine.synthesize(text="Hi.", voice=voice))) == 1
