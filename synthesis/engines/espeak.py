"""Real (robotic) speech from the espeak-ng library shipped by `espeakng-loader`.

espeak-ng is driven through ctypes in synchronous mode: `espeak_Synth` blocks
and hands audio to a callback as it is produced. The library keeps global state
(one voice, one callback, one set of parameters per process) and is not
thread-safe, so every call into it happens under one process-wide lock, and
one synthesis runs at a time. Streaming is done by running `espeak_Synth` in a
thread that pushes chunks into a queue, which the caller's generator drains.
"""

from __future__ import annotations

import ctypes
import queue
import threading
from collections.abc import Generator
from typing import Any

import numpy as np

from chorus.errors import EngineError, EngineUnavailable
from synthesis.engines.base import (
    EngineInfo,
    PreparedVoice,
    ReferenceAudio,
    Samples,
    check_speed,
    dump_json_voice,
    load_json_voice,
)

# Constants from espeak-ng's speak_lib.h.
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_EE_OK = 0
_PARAM_RATE = 1
_RATE_MIN, _RATE_MAX = 80, 450

DEFAULT_LANGUAGE = "en"
DEFAULT_RATE_WPM = 175
# Audio handed to the callback per call, in ms: small enough to stream promptly.
_BUFFER_MS = 100

_SynthCallback = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p
)


class _Voice(ctypes.Structure):
    """espeak_VOICE, used to select a voice by language."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("languages", ctypes.c_char_p),
        ("identifier", ctypes.c_char_p),
        ("gender", ctypes.c_ubyte),
        ("age", ctypes.c_ubyte),
        ("variant", ctypes.c_ubyte),
        ("xx1", ctypes.c_ubyte),
        ("score", ctypes.c_int),
        ("spare", ctypes.c_void_p),
    ]


class _Sink:
    """Where the running synthesis sends its audio, and whether to stop."""

    def __init__(self) -> None:
        self.chunks: queue.SimpleQueue[Samples | BaseException | None] = queue.SimpleQueue()
        self.cancelled = threading.Event()


class _Library:
    """The process's one initialized espeak-ng; use only while holding `lock`."""

    lock = threading.Lock()
    _instance: _Library | None = None

    def __init__(self) -> None:
        import espeakng_loader

        lib = ctypes.CDLL(espeakng_loader.get_library_path())
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_SetSynthCallback.argtypes = [_SynthCallback]
        lib.espeak_SetSynthCallback.restype = None
        lib.espeak_SetVoiceByProperties.argtypes = [ctypes.POINTER(_Voice)]
        lib.espeak_SetVoiceByProperties.restype = ctypes.c_int
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_SetParameter.restype = ctypes.c_int
        lib.espeak_Synth.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        lib.espeak_Synth.restype = ctypes.c_int

        data_path = espeakng_loader.get_data_path().encode()
        rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, _BUFFER_MS, data_path, 0)
        if rate <= 0:
            raise EngineUnavailable(f"espeak-ng failed to initialize (code {rate})")
        self.lib = lib
        self.sample_rate = int(rate)
        self.sink: _Sink | None = None
        # The C callback must stay referenced for as long as the library may call it.
        self._callback = _SynthCallback(self._on_audio)
        lib.espeak_SetSynthCallback(self._callback)

    @classmethod
    def get(cls) -> _Library:
        """The initialized library; caller holds `lock` (initialization is global too)."""
        if cls._instance is None:
            try:
                cls._instance = cls()
            except OSError as exc:
                raise EngineUnavailable(f"cannot load the espeak-ng library: {exc}") from exc
        return cls._instance

    def _on_audio(self, wav: Any, count: int, _events: Any) -> int:
        sink = self.sink
        if sink is None or sink.cancelled.is_set():
            return 1  # non-zero aborts the synthesis: nobody is listening any more
        if count > 0 and wav:
            pcm = np.ctypeslib.as_array(wav, shape=(count,))
            sink.chunks.put(pcm.astype(np.float32) / np.float32(32768.0))
        return 0

    def set_language(self, language: str) -> str:
        """Select the voice for `language`, falling back to English; return what was used."""
        for candidate in (language, DEFAULT_LANGUAGE):
            spec = _Voice()
            spec.languages = candidate.encode("ascii", "ignore")
            if self.lib.espeak_SetVoiceByProperties(ctypes.byref(spec)) == _EE_OK:
                return candidate
        raise EngineError("espeak-ng has no English voice; its data files are incomplete")

    def synthesize(self, text: str, sink: _Sink) -> None:
        encoded = text.encode("utf-8") + b"\0"
        self.sink = sink
        try:
            code = self.lib.espeak_Synth(
                encoded, len(encoded), 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None
            )
        finally:
            self.sink = None
        if code != _EE_OK and not sink.cancelled.is_set():
            raise EngineError(f"espeak-ng synthesis failed (code {code})")


def normalize_language(language: str) -> str:
    """BCP-47-ish tag as espeak spells it ("pt_BR" -> "pt-br"); empty -> English."""
    tag = language.strip().replace("_", "-").lower()
    return tag or DEFAULT_LANGUAGE


def rate_for_speed(speed: float) -> int:
    """espeak's words-per-minute for a speed multiplier, within espeak's accepted range."""
    return max(_RATE_MIN, min(_RATE_MAX, round(DEFAULT_RATE_WPM * speed)))


class EspeakEngine:
    """Intelligible but robotic speech, CPU only, no model weights.

    Useful for development and for proving the service end to end without a GPU.
    """

    name = "espeak"
    supports_streaming_speed = True
    deterministic = True
    # espeak-ng keeps one global synthesizer state per process: one call at a time.
    max_concurrent_streams: int | None = 1
    follows_instructions = False  # espeak-ng has no style control to map one onto

    def __init__(self, *, default_language: str = DEFAULT_LANGUAGE) -> None:
        self.default_language = normalize_language(default_language)
        self.sample_rate = 22050  # replaced by what espeak_Initialize reports
        self._loaded = False

    def load(self) -> None:
        with _Library.lock:
            self.sample_rate = _Library.get().sample_rate
        self._loaded = True

    def info(self) -> EngineInfo:
        return EngineInfo(
            name=self.name, sample_rate=self.sample_rate, device="cpu", memory_bytes=0
        )

    def prepare_voice(self, reference: ReferenceAudio) -> PreparedVoice:
        """Record the reference's language.

        This is not a voice clone: it speaks with espeak-ng's own voice for the
        reference's language. The reference audio itself is not used.
        """
        language = normalize_language(reference.language or self.default_language)
        return PreparedVoice(engine=self.name, data={"language": language})

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
        # `instruction` is ignored: espeak-ng has no notion of a speaking style.
        if not self._loaded:
            raise EngineError("espeak engine used before load()")
        check_speed(speed)
        language = self.default_language
        if voice is not None and voice.data.get("language"):
            language = normalize_language(str(voice.data["language"]))
        # A NUL would end the C string early and silently drop the rest of the text.
        return self._stream(text.replace("\0", " "), language, rate_for_speed(speed))

    def _stream(self, text: str, language: str, rate: int) -> Generator[Samples, None, None]:
        sink = _Sink()
        worker = threading.Thread(
            target=self._run, args=(text, language, rate, sink), name="espeak-synth", daemon=True
        )
        worker.start()
        try:
            while True:
                item = sink.chunks.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            # Closed early (or failed): the callback sees this and aborts espeak_Synth,
            # so the lock is released promptly for the next synthesis.
            sink.cancelled.set()

    @staticmethod
    def _run(text: str, language: str, rate: int, sink: _Sink) -> None:
        try:
            with _Library.lock:
                if sink.cancelled.is_set():
                    return
                library = _Library.get()
                library.set_language(language)
                library.lib.espeak_SetParameter(_PARAM_RATE, rate, 0)
                library.synthesize(text, sink)
        except BaseException as exc:  # handed to the consumer, which re-raises it
            sink.chunks.put(exc)
        finally:
            sink.chunks.put(None)

    def close(self) -> None:
        # espeak-ng's state is process-global and shared by every instance; it is
        # deliberately kept initialized until the process exits.
        self._loaded = False
