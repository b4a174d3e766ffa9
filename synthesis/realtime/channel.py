"""What the web tier tells a session's worker, over the session's input stream.

The web tier is the only writer (`send`) and the worker the only reader
(`decode_input`). Entries are flat Redis field maps with ``t``:

* ``start``: ``cfg`` (JSON: the session's settings the worker needs);
* ``append``: ``c`` (context), ``x`` (text, already reserved);
* ``flush``: ``c``; ``cancel``: ``c``;
* ``close``: speak what is left, then end;
* ``gone``: the client went away: stop at once.

From its claim until its end is published, the session's worker keeps
`alive_key` set (`ALIVE_TTL_MS`, renewed every `ALIVE_EVERY_S`): a web tier that
sees it vanish tells its client the worker was lost instead of waiting in
silence.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Both keys outlive the longest session a plan allows; the runner deletes the
# input stream when it ends.
INPUT_TTL_S = 3 * 3600
ALIVE_TTL_MS = 3000
ALIVE_EVERY_S = 0.5


def input_key(job_id: uuid.UUID | str) -> str:
    return f"chorus:rt:{job_id}:in"


def alive_key(job_id: uuid.UUID | str) -> str:
    return f"chorus:rt:{job_id}:alive"


@dataclass(frozen=True)
class SessionConfig:
    """What the worker needs of a session beyond its job row."""

    context: str  # the first context's id
    idle_timeout_s: float
    max_seconds: float
    store: bool


@dataclass(frozen=True)
class Start:
    config: SessionConfig


@dataclass(frozen=True)
class Append:
    context: str
    text: str


@dataclass(frozen=True)
class Flush:
    context: str


@dataclass(frozen=True)
class Cancel:
    context: str


@dataclass(frozen=True)
class Close:
    pass


@dataclass(frozen=True)
class Gone:
    pass


Input = Start | Append | Flush | Cancel | Close | Gone


def encode_input(item: Input) -> dict[str, str]:
    if isinstance(item, Start):
        return {"t": "start", "cfg": json.dumps(item.config.__dict__)}
    if isinstance(item, Append):
        return {"t": "append", "c": item.context, "x": item.text}
    if isinstance(item, Flush):
        return {"t": "flush", "c": item.context}
    if isinstance(item, Cancel):
        return {"t": "cancel", "c": item.context}
    return {"t": "close" if isinstance(item, Close) else "gone"}


def decode_input(fields: Mapping[bytes, bytes]) -> Input:
    kind = fields.get(b"t", b"").decode()
    context = fields.get(b"c", b"").decode()
    if kind == "start":
        config: dict[str, Any] = json.loads(fields[b"cfg"])
        return Start(SessionConfig(**config))
    if kind == "append":
        return Append(context=context, text=fields[b"x"].decode())
    if kind == "flush":
        return Flush(context)
    if kind == "cancel":
        return Cancel(context)
    if kind == "close":
        return Close()
    return Gone()


def send(client: Any, job_id: uuid.UUID | str, item: Input) -> Any:
    """Append `item` to the session's input stream (awaitable with an asyncio
    client: the web tier's)."""
    pipe = client.pipeline(transaction=False)
    pipe.xadd(input_key(job_id), encode_input(item))  # type: ignore[arg-type]
    pipe.expire(input_key(job_id), INPUT_TTL_S)
    return pipe.execute()
