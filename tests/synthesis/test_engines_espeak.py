"""EspeakEngine: real speech from the bundled espeak-ng library, streamed."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from chorus.errors import EngineError, EngineUnavailable, InvalidInput
from synthesis.engines import load_engine
from synthesis.engines.base import Engine, PreparedVoice, ReferenceAudio
from synthesis.engines.espeak import EspeakEngine, rate_for_speed

SENTENCE = "The quick brown fox jumps over the lazy dog, and then it runs far away."
MANDARIN = "你好，世界。今天天气很好，我们一起去公园散步吧。"  # noqa: RUF001 (real Chinese punctuation)


@pytest.fixture(scope="module")
def engine() -> EspeakEngine:
    loaded = load_engine("espeak")
    assert isinstance(loaded, EspeakEngine)
    return loaded


def speak(engine: EspeakEngine, text: str, language: str = "en", speed: float = 1.0) -> np.ndarray:
    voice = PreparedVoice(engine="espeak", data={"language": language})
    chunks = list(engine.synthesize(text=text, voice=voice, speed=speed))
    assert chunks, "no audio at all"
    assert all(chunk.dtype == np.float32 and chunk.ndim == 1 for chunk in chunks)
    return np.concatenate(chunks)


def seconds(engine: EspeakEngine, samples: np.ndarray) -> float:
    return len(samples) / engine.sample_rate


def test_loads_and_reports_itself(engine: EspeakEngine) -> None:
    assert isinstance(engine, Engine)
    assert engine.sample_rate == 22050
    info = engine.info()
    assert (info.name, info.sample_rate, info.device) == ("espeak", 22050, "cpu")


def test_english_is_audible_and_plausibly_long(engine: EspeakEngine) -> None:
    audio = speak(engine, SENTENCE)
    assert 2.0 < seconds(engine, audio) < 8.0  # ~14 words at 175 wpm
    assert float(np.sqrt(np.mean(audio**2))) > 0.02
    assert float(np.abs(audio).max()) <= 1.0


def test_mandarin_is_audible_and_plausibly_long(engine: EspeakEngine) -> None:
    audio = speak(engine, MANDARIN, language="zh")
    assert 2.0 < seconds(engine, audio) < 12.0  # 22 syllables
    assert float(np.sqrt(np.mean(audio**2))) > 0.02
    # Spoken as Mandarin: the English voice would spell each character out, far longer.
    assert len(audio) < 0.6 * len(speak(engine, MANDARIN, language="en"))


def test_longer_text_streams_in_several_chunks(engine: EspeakEngine) -> None:
    chunks = list(engine.synthesize(text=SENTENCE, voice=None))
    assert len(chunks) > 5


def test_faster_speed_gives_shorter_audio(engine: EspeakEngine) -> None:
    normal = seconds(engine, speak(engine, SENTENCE, speed=1.0))
    fast = seconds(engine, speak(engine, SENTENCE, speed=2.0))
    slow = seconds(engine, speak(engine, SENTENCE, speed=0.5))
    assert fast < 0.75 * normal
    assert slow > 1.3 * normal


def test_speed_maps_to_espeak_rate() -> None:
    assert rate_for_speed(1.0) == 175
    assert rate_for_speed(2.0) == 350
    assert rate_for_speed(0.5) == 88


def test_speed_outside_the_range_is_invalid(engine: EspeakEngine) -> None:
    with pytest.raises(InvalidInput):
        engine.synthesize(text="hi", voice=None, speed=3.0)


def test_unknown_language_falls_back_to_english(engine: EspeakEngine) -> None:
    # espeak adds small random variations, so voices are told apart by length: the
    # English voice spells Chinese characters out and takes more than twice as long.
    mandarin = len(speak(engine, MANDARIN, language="zh"))  # leaves espeak on Mandarin
    fallback = len(speak(engine, MANDARIN, language="xx-nonexistent"))
    english = len(speak(engine, MANDARIN, language="en"))
    assert fallback == pytest.approx(english, rel=0.02)
    assert fallback > 1.5 * mandarin


def test_prepare_voice_records_the_language(engine: EspeakEngine) -> None:
    reference = ReferenceAudio(
        samples=np.zeros(16000 * 3, dtype=np.float32), sample_rate=16000, language="pt_BR"
    )
    voice = engine.prepare_voice(reference)
    assert voice.engine == "espeak"
    assert voice.data == {"language": "pt-br"}
    no_language = ReferenceAudio(samples=reference.samples, sample_rate=16000)
    assert engine.prepare_voice(no_language).data == {"language": "en"}


def test_closing_a_stream_early_does_not_block_the_next_call(engine: EspeakEngine) -> None:
    stream = engine.synthesize(text=SENTENCE * 20, voice=None)
    next(stream)
    stream.close()

    done = threading.Event()
    result: list[np.ndarray] = []

    def later_call() -> None:
        result.append(speak(engine, "Still working."))
        done.set()

    threading.Thread(target=later_call, daemon=True).start()
    assert done.wait(timeout=10), "the next synthesis hung after an early close"
    assert seconds(engine, result[0]) > 0.3


def test_abandoned_stream_that_never_started_is_harmless(engine: EspeakEngine) -> None:
    engine.synthesize(text=SENTENCE, voice=None)  # never iterated: no thread, no lock
    assert seconds(engine, speak(engine, "Hello.")) > 0.2


def test_concurrent_threads_each_get_their_own_audio(engine: EspeakEngine) -> None:
    expected = speak(engine, SENTENCE)
    results: list[np.ndarray] = []
    lock = threading.Lock()

    def worker() -> None:
        audio = speak(engine, SENTENCE)
        with lock:
            results.append(audio)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert time.monotonic() - started < 20
    assert len(results) == 4
    for audio in results:  # each thread got a whole sentence, not a share of another's
        assert len(audio) == pytest.approx(len(expected), rel=0.02)


def test_registry_rejects_unknown_engines_and_bad_options() -> None:
    with pytest.raises(EngineUnavailable, match="espeak, synthetic"):
        load_engine("festival")
    with pytest.raises(EngineUnavailable, match="invalid options"):
        load_engine("cosyvoice2")  # no model_dir
    with pytest.raises(EngineUnavailable, match="invalid options"):
        load_engine("espeak", {"no_such_option": 1})


def test_instruction_is_ignored(engine: EspeakEngine) -> None:
    voice = PreparedVoice(engine="espeak", data={"language": "en"})
    plain = np.concatenate(list(engine.synthesize(text="Hello.", voice=voice)))
    styled = engine.synthesize(text="Hello.", voice=voice, instruction="Whisper.")
    assert len(np.concatenate(list(styled))) == pytest.approx(len(plain), rel=0.02)


def test_a_dumped_voice_loads_back(engine: EspeakEngine) -> None:
    voice = PreparedVoice(engine="espeak", data={"language": "pt-br"})
    assert engine.load_voice(engine.dump_voice(voice)) == voice
    assert engine.supports_streaming_speed is True
    with pytest.raises(EngineError):
        engine.load_voice(b'{"engine": "synthetic", "data": {}}')
    with pytest.raises(EngineError):
        engine.load_voice(b"\xff not json")
