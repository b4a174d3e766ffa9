"""The live stream's wire format: what a worker appends to a job's Redis stream
and what the web tier reads back (`synthesis.streaming` writes, `synthesis.api.
streaming` relays). `encode` is the only writer and `decode` the only reader, so
a new field (word timings for a realtime route, say) is added here, once.

An entry is a flat Redis field map:

* every entry: ``v`` (protocol version), ``t`` (``chunk``, ``done`` or ``error``)
  and ``a`` (the attempt that wrote it; absent when the web tier or the sweeper
  ends a job no worker streams);
* ``chunk``: ``n`` (sequence within the attempt, from 0), ``sr`` (sample rate),
  ``e`` (engine), ``d`` (1 if the engine is deterministic), ``pcm`` (mono s16le),
  ``al`` when the chunk has an alignment (JSON: ``[[text, start_s, end_s], ...]``),
  and ``c`` when it belongs to a realtime session's context (its id);
* ``said`` (realtime sessions only): ``c`` (the context), ``ch`` (characters
  spoken in it since its last ``said``), ``why`` (``flush``, ``close`` or
  ``cancel``): what was sent of the context so far is spoken;
* ``done``: ``job`` (the job id): the file is stored and the job succeeded;
  ``w`` when a realtime session ended other than by its client's close
  (``idle_timeout``, ``session_too_long``);
* ``error``: ``code``, ``message``: the job ended without audio.

An optional field that readers may ignore is not a new version; a change an old
reader would misread is. Entries written before the version field existed carry
none and read as version 1, their layout (a stream outlives a deploy by up to an
hour). An entry of another version or a malformed one raises
`StreamProtocolError`, naming what is wrong, never a bare KeyError.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from redis.typing import EncodableT, FieldT

PROTOCOL_VERSION = 1
READABLE_VERSIONS = frozenset({1})


class StreamProtocolError(ValueError):
    """A stream entry this reader cannot read: another version, or malformed."""


@dataclass(frozen=True)
class Timing:
    """A word or character of the text and when it sounds, in seconds from the
    start of its chunk. Reserved: no engine reports timings yet."""

    text: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Chunk:
    pcm: bytes  # mono s16le
    sample_rate: int
    sequence: int = 0
    attempt: int | None = None
    engine: str = ""
    deterministic: bool = False
    alignment: tuple[Timing, ...] | None = None
    context: str | None = None  # a realtime session's context


@dataclass(frozen=True)
class Said:
    """A realtime context's text so far is spoken (or, `why` cancel, dropped):
    `characters` were sent to the engine since the context's last `Said`."""

    context: str
    characters: int
    why: str  # flush, close or cancel
    attempt: int | None = None


@dataclass(frozen=True)
class Done:
    attempt: int | None = None
    job_id: str = ""
    ending: str = ""  # a realtime session's, when not its client's close


@dataclass(frozen=True)
class Failed:
    code: str
    message: str
    attempt: int | None = None


Event = Chunk | Said | Done | Failed
# An entry as redis-py's XADD takes it.
Fields = dict[FieldT, EncodableT]


def encode(event: Event) -> Fields:
    """The stream entry for `event`."""
    fields: Fields = {"v": PROTOCOL_VERSION}
    if isinstance(event, Chunk):
        fields.update(
            t="chunk",
            n=event.sequence,
            sr=event.sample_rate,
            e=event.engine,
            d=int(event.deterministic),
            pcm=event.pcm,
        )
        if event.alignment is not None:
            fields["al"] = json.dumps([[t.text, t.start_s, t.end_s] for t in event.alignment])
        if event.context is not None:
            fields["c"] = event.context
    elif isinstance(event, Said):
        fields.update(t="said", c=event.context, ch=event.characters, why=event.why)
    elif isinstance(event, Done):
        fields.update(t="done", job=event.job_id)
        if event.ending:
            fields["w"] = event.ending
    else:
        fields.update(t="error", code=event.code, message=event.message)
    if event.attempt is not None:
        fields["a"] = event.attempt
    return fields


def decode(fields: Mapping[bytes, bytes]) -> Event:
    """The event of a stream entry as redis-py returns it (bytes keys and values)."""
    version = _int(fields, b"v") if b"v" in fields else 1
    if version not in READABLE_VERSIONS:
        raise StreamProtocolError(
            f"stream protocol version {version} is not readable here "
            f"(this reader reads {', '.join(map(str, sorted(READABLE_VERSIONS)))})"
        )
    kind = fields.get(b"t")
    attempt = _int(fields, b"a") if b"a" in fields else None
    if kind == b"chunk":
        return Chunk(
            pcm=_field(fields, b"pcm"),
            sample_rate=_int(fields, b"sr"),
            sequence=_int(fields, b"n"),
            attempt=attempt,
            engine=_text(fields, b"e", default=""),
            deterministic=_int(fields, b"d") == 1 if b"d" in fields else False,
            alignment=_alignment(fields[b"al"]) if b"al" in fields else None,
            context=_text(fields, b"c") if b"c" in fields else None,
        )
    if kind == b"said":
        return Said(
            context=_text(fields, b"c"),
            characters=_int(fields, b"ch"),
            why=_text(fields, b"why"),
            attempt=attempt,
        )
    if kind == b"done":
        return Done(
            attempt=attempt,
            job_id=_text(fields, b"job", default=""),
            ending=_text(fields, b"w", default=""),
        )
    if kind == b"error":
        return Failed(
            code=_text(fields, b"code"), message=_text(fields, b"message"), attempt=attempt
        )
    raise StreamProtocolError(f"stream entry of unknown type {kind!r}")


def _field(fields: Mapping[bytes, bytes], name: bytes) -> bytes:
    try:
        return fields[name]
    except KeyError:
        raise StreamProtocolError(
            f"stream entry {fields.get(b't')!r} lacks its {name.decode()!r} field"
        ) from None


def _int(fields: Mapping[bytes, bytes], name: bytes) -> int:
    value = _field(fields, name)
    try:
        return int(value)
    except ValueError:
        raise StreamProtocolError(
            f"stream entry field {name.decode()!r} is not an integer: {value!r}"
        ) from None


def _text(fields: Mapping[bytes, bytes], name: bytes, *, default: str | None = None) -> str:
    if default is not None and name not in fields:
        return default
    try:
        return _field(fields, name).decode()
    except UnicodeDecodeError:
        raise StreamProtocolError(f"stream entry field {name.decode()!r} is not UTF-8") from None


def _alignment(raw: bytes) -> tuple[Timing, ...]:
    try:
        items: Any = json.loads(raw)
        return tuple(Timing(str(text), float(start), float(end)) for text, start, end in items)
    except (ValueError, TypeError):
        raise StreamProtocolError(f"stream entry's alignment is malformed: {raw[:80]!r}") from None
