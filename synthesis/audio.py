"""Reference-audio validation and output encoding (no Django, no torch).

Uploads are judged only by decoding them: a file name or content type says
nothing about what the bytes are. Durations come from the samples actually
decoded, never from a header's frame count, which a truncated or crafted file
can misstate. A header can only get a file refused, before any decoding: its
format, channels and sample rate, and a length past where decoding would stop.

Memory is bounded before decoding starts: the header's sample rate and the
duration limits give a frame cap, decoding goes block by block into one buffer
that never outgrows it, and a file that decodes to more than its size can hold
is refused as soon as it does, whatever its header claims.

Silence at either end is trimmed before the duration rule applies: the limits
are about how much voice a recording holds, and a user should not be refused
for a pause before speaking or after stopping the recorder.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import soundfile as sf

from chorus.errors import (
    AudioInconsistent,
    AudioTooLong,
    AudioTooShort,
    EmptyFile,
    FileTooLarge,
    SampleRateTooHigh,
    SampleRateTooLow,
    TooManyChannels,
    UnsupportedAudio,
)
from synthesis.engines.base import ReferenceAudio, Samples

# Containers we accept. libsndfile parses many exotic formats; nobody records a
# voice reference in them, and each extra parser is attack surface for uploads.
ACCEPTED_FORMATS = frozenset({"WAV", "WAVEX", "RF64", "W64", "FLAC", "OGG", "MP3", "AIFF", "CAF"})
# The highest rate a voice upload may have. CosyVoice2 resamples a prompt to 16 kHz
# (speech tokens, speaker embedding) and 24 kHz (mel features), so nothing above
# 48 kHz reaches the model, and phones, browsers and microphones record at 44.1 or
# 48 kHz. It also bounds what an upload decodes to: (30 + 30 + 1) s at 48 kHz is
# 11 MiB of mono float32, where 384 kHz would be 90 MiB.
MAX_UPLOAD_SAMPLE_RATE = 48000
# Above any real recording rate; the ceiling for audio stored before uploads had one.
MAX_SAMPLE_RATE = 384000
_BLOCK_FRAMES = 65536
# libsndfile's frame count when the header does not say (SF_COUNT_MAX).
_UNKNOWN_FRAMES = 2**63 - 1
# Containers whose frame count libsndfile may estimate rather than read: an MP3
# without a Xing/Info header gets one from its size and first frame's bitrate.
_ESTIMATED_LENGTH = frozenset({"MP3"})

# Silence is judged per 10 ms frame, relative to the loudest frame: uploads come
# at any gain, so an absolute threshold would cut soft speech from a quiet
# recording and keep the hiss of a hot one. 45 dB below the loudest frame sits
# under the quietest consonants of normal speech yet above the noise floor of
# a decent recording; in a noisier one nothing is trimmed, the safe direction.
SILENCE_BELOW_PEAK_DB = 45.0
# Nothing louder than this anywhere means there is no voice to clone at all.
SILENCE_FLOOR_DBFS = -60.0
_TRIM_FRAME_S = 0.010
# Kept on each side of the voice so soft onsets and decays are not clipped off.
_TRIM_MARGIN_S = 0.050


@dataclass(frozen=True)
class DecodedReference:
    samples: Samples  # mono float32 in [-1, 1]; multi-channel input is averaged
    sample_rate: int
    channels: int  # of the upload, before mixing down
    duration_s: float  # after trimming silence at either end; what the limits apply to
    original_duration_s: float  # of the whole upload, silence included
    format: str  # libsndfile's container name: "WAV", "FLAC", "OGG", "MP3", ...

    def to_reference(self, *, transcript: str = "", language: str = "") -> ReferenceAudio:
        return ReferenceAudio(
            samples=self.samples,
            sample_rate=self.sample_rate,
            transcript=transcript,
            language=language,
        )


def decode_reference(
    data: bytes,
    *,
    max_bytes: int,
    min_seconds: float = 3.0,
    max_seconds: float = 30.0,
    min_sample_rate: int = 16000,
    max_sample_rate: int = MAX_SAMPLE_RATE,
    max_channels: int = 2,
    max_silence_seconds: float = 30.0,
) -> DecodedReference:
    """Decode and validate an uploaded voice reference, or raise the matching ChorusError.

    The duration limits apply after silence at either end is trimmed; up to
    `max_silence_seconds` of such silence is decoded on top of `max_seconds`.
    At most (max_seconds + max_silence_seconds + 1) x max_sample_rate float32
    samples are held, whatever the file claims.
    """
    if len(data) == 0:
        raise EmptyFile("the uploaded file is empty")
    if len(data) > max_bytes:
        raise FileTooLarge(
            f"the file is {len(data)} bytes; the limit is {max_bytes} bytes",
            details={"limit_bytes": max_bytes, "size_bytes": len(data)},
        )
    # One second of slack over the limits tells "too long" apart from "at the
    # limit" while bounding memory whatever the header claims.
    cap_seconds = max_seconds + max_silence_seconds + 1
    with _open(data) as audio:
        channels, sample_rate, container = audio.channels, audio.samplerate, audio.format
        _check_stream(
            container, channels, sample_rate, min_sample_rate, max_sample_rate, max_channels
        )
        cap = int(cap_seconds * sample_rate)
        claimed = _claimed_frames(audio)
        if claimed is not None and claimed > cap and container not in _ESTIMATED_LENGTH:
            # Refused as decoding would refuse it, only without decoding it.
            raise _too_long(cap_seconds, max_seconds, max_silence_seconds)
        mono, more = _read_mono(audio, cap=cap, expected=claimed, size=len(data))

    if more:
        raise _too_long(cap_seconds, max_seconds, max_silence_seconds)
    original = len(mono) / sample_rate
    voice = _voice_span(mono, sample_rate)
    if voice is None:
        raise AudioTooShort(
            f"the audio is silent: nothing in it is louder than {SILENCE_FLOOR_DBFS:g} dBFS",
            details=_duration_details(min_seconds, 0.0, original),
        )
    trimmed = mono[voice]
    duration = len(trimmed) / sample_rate
    _check_duration(duration, original, min_seconds, max_seconds)
    return DecodedReference(
        samples=np.ascontiguousarray(trimmed, dtype=np.float32),
        sample_rate=sample_rate,
        channels=channels,
        duration_s=duration,
        original_duration_s=original,
        format=container,
    )


# No codec we accept squeezes real recordings past this many times their size in
# 16-bit PCM (Ogg Opus at its lowest bitrate, stereo 48 kHz, is about 250x); a
# file that decodes to more is crafted to (a decompression bomb) and is refused.
MAX_EXPANSION = 300


def _too_long(cap_seconds: float, max_seconds: float, max_silence_seconds: float) -> AudioTooLong:
    # The same words whether the header or the decoder found it: decoding stops
    # at the cap, so the length past it is never known for sure.
    return AudioTooLong(
        f"the file holds more than {cap_seconds:g} seconds of audio; at most "
        f"{max_seconds:g} seconds are accepted, plus up to {max_silence_seconds:g} "
        "seconds of silence at its ends",
        details=_duration_details(max_seconds, cap_seconds, cap_seconds),
    )


def _inconsistent(size: int, pcm_bytes: int) -> AudioInconsistent:
    return AudioInconsistent(
        f"the file is {size} bytes but decodes to at least {pcm_bytes} bytes of audio, far "
        "more than any recording of that size holds",
        details={"size_bytes": size, "decoded_bytes": pcm_bytes, "max_ratio": MAX_EXPANSION},
    )


def _claimed_frames(audio: sf.SoundFile) -> int | None:
    """The header's frame count, or None when it has none."""
    frames = audio.frames
    return frames if 0 <= frames < _UNKNOWN_FRAMES else None


def _check_stream(
    container: str,
    channels: int,
    sample_rate: int,
    min_sample_rate: int,
    max_sample_rate: int,
    max_channels: int,
) -> None:
    if container not in ACCEPTED_FORMATS:
        raise UnsupportedAudio(
            f"{container} audio is not accepted; use WAV, FLAC, OGG or MP3",
            details={"format": container},
        )
    if channels > max_channels:
        raise TooManyChannels(
            f"the audio has {channels} channels; at most {max_channels} are accepted",
            details={"limit": max_channels, "value": channels},
        )
    if sample_rate < min_sample_rate:
        raise SampleRateTooLow(
            f"the sample rate is {sample_rate} Hz; at least {min_sample_rate} Hz is required",
            details={"limit": min_sample_rate, "value": sample_rate},
        )
    if sample_rate > max_sample_rate:
        raise SampleRateTooHigh(
            f"the sample rate is {sample_rate} Hz; at most {max_sample_rate} Hz is accepted "
            f"(resample the recording to {max_sample_rate} Hz or less)",
            details={"limit": max_sample_rate, "value": sample_rate},
        )


def _check_duration(
    duration: float, original: float, min_seconds: float, max_seconds: float
) -> None:
    # Say so when trimming changed the length, or the number looks wrong to the user.
    note = "" if duration == original else f" without the silence at its ends ({original:.2f} s)"
    if duration > max_seconds:
        raise AudioTooLong(
            f"the audio is {duration:.2f} seconds{note}; at most {max_seconds:g} are accepted",
            details=_duration_details(max_seconds, duration, original),
        )
    if duration < min_seconds:
        raise AudioTooShort(
            f"the audio is {duration:.2f} seconds{note}; "
            f"at least {min_seconds:g} seconds are required",
            details=_duration_details(min_seconds, duration, original),
        )


def _duration_details(limit: float, value: float, original: float) -> dict[str, float]:
    return {
        "limit_seconds": limit,
        "value_seconds": round(value, 2),
        "original_seconds": round(original, 2),
    }


def _voice_span(mono: Samples, sample_rate: int) -> slice | None:
    """The samples from the first to the last non-silent frame, plus a margin.

    None when the whole recording is silent; an empty recording is an empty span.
    """
    if len(mono) == 0:
        return slice(0, 0)
    frame = max(1, round(_TRIM_FRAME_S * sample_rate))
    power = _frame_power(mono, frame)
    loudest = float(power.max())
    # Compared as mean squares (power), so dB steps are tenths, not twentieths.
    floor = 10 ** (SILENCE_FLOOR_DBFS / 10)
    if loudest < floor:
        return None
    threshold = max(loudest * 10 ** (-SILENCE_BELOW_PEAK_DB / 10), floor)
    loud = np.flatnonzero(power >= threshold)
    margin = round(_TRIM_MARGIN_S * sample_rate)
    start = max(0, int(loud[0]) * frame - margin)
    end = min(len(mono), (int(loud[-1]) + 1) * frame + margin)
    return slice(start, end)


def _frame_power(mono: Samples, frame: int) -> np.ndarray:
    """Mean square of each `frame`-sample frame; a shorter last frame counts too."""
    full = len(mono) // frame
    blocks = mono[: full * frame].reshape(full, frame)
    # einsum sums the squares row by row without a squared copy of the whole file.
    power = np.einsum("ij,ij->i", blocks, blocks) / frame
    tail = mono[full * frame :]
    if len(tail):
        power = np.append(power, float(np.dot(tail, tail)) / len(tail))
    return power


def encode_wav(samples: Samples, sample_rate: int) -> bytes:
    """16-bit PCM mono WAV; samples outside [-1, 1] are clipped, not wrapped."""
    clipped = np.clip(np.asarray(samples, dtype=np.float32).reshape(-1), -1.0, 1.0)
    buffer = io.BytesIO()
    sf.write(buffer, clipped, sample_rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def audio_duration(data: bytes) -> float:
    """Seconds of audio in `data`, counted from the decoded samples."""
    with _open(data) as audio:
        total = 0
        try:
            for block in audio.blocks(blocksize=_BLOCK_FRAMES, dtype="float32", always_2d=True):
                total += len(block)
        except Exception as exc:
            raise _unsupported(exc) from exc
        return total / audio.samplerate


@contextmanager
def _open(data: bytes) -> Iterator[sf.SoundFile]:
    """`sf.SoundFile` over bytes, with any failure to open it as UnsupportedAudio."""
    try:
        audio = sf.SoundFile(io.BytesIO(data))
    except Exception as exc:  # soundfile raises several types for bad input
        raise _unsupported(exc) from exc
    with audio:
        yield audio


def _read_mono(
    audio: sf.SoundFile, *, cap: int, expected: int | None, size: int
) -> tuple[Samples, bool]:
    """Up to `cap` frames mixed down to mono, and whether more audio follows.

    Blocks are mixed into one buffer sized from the header's frame count and
    grown when the header said less or nothing, never past `cap`: memory is
    bounded by the cap whatever the file claims. Mixing block by block keeps one
    float32 value per frame, not one per channel. A file of `size` bytes is
    refused as soon as it decodes to more than MAX_EXPANSION times that.
    """
    # Never more than the size allows either (past that the file is refused): a
    # bomb's header may well claim its true length.
    most = min(cap, size * MAX_EXPANSION // (2 * audio.channels))
    mono = np.empty(min(most, _BLOCK_FRAMES if expected is None else expected), np.float32)
    count = 0
    while count < cap:
        block = _read_block(audio, min(_BLOCK_FRAMES, cap - count))
        frames = len(block)
        if frames == 0:
            break
        pcm_bytes = (count + frames) * audio.channels * 2
        if pcm_bytes > size * MAX_EXPANSION:
            raise _inconsistent(size, pcm_bytes)
        if count + frames > len(mono):
            # In place (realloc, mremap for large buffers): growing never holds
            # two copies. Safe without the reference check: no view of `mono`
            # outlives the statement that makes it.
            mono.resize(min(most, max(count + frames, 2 * len(mono))), refcheck=False)
        if block.shape[1] > 1:
            np.mean(block, axis=1, dtype=np.float32, out=mono[count : count + frames])
        else:
            mono[count : count + frames] = block[:, 0]
        count += frames
    more = count >= cap and len(_read_block(audio, 1)) > 0
    return mono[:count], more


def _read_block(audio: sf.SoundFile, frames: int) -> np.ndarray:
    try:
        return audio.read(frames, dtype="float32", always_2d=True)
    except Exception as exc:  # corrupt or truncated data mid-stream
        raise _unsupported(exc) from exc


def _unsupported(exc: Exception) -> UnsupportedAudio:
    # libsndfile's own words; str() of soundfile's error names the buffer it was
    # given ("Error opening <_io.BytesIO object at 0x...>: ..."), nothing a caller can use.
    reason = getattr(exc, "error_string", None) or _OBJECT_REPR.sub("the file", str(exc))
    return UnsupportedAudio(
        "the file could not be decoded as audio (WAV, FLAC, OGG or MP3)",
        details={"reason": reason[:200]},
    )


_OBJECT_REPR = re.compile(r"<[\w.]+ object at 0x[0-9a-fA-F]+>")
