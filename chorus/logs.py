"""Structured logs: one JSON object per line, carrying the context of the work.

A request (`chorus.request_log`) or a job's task (`synthesis.tasks`) opens a
context with `log_scope`; code deeper down adds to it with `log_bind` (the
tenant once the key is known, the job once it exists), and every record logged
meanwhile carries those fields: request id, tenant id, job id, worker, attempt.
The context is one mutable dict per scope, so what a view running in a worker
thread binds is seen by the middleware that opened the scope on the event loop.

Only ids, codes and timings go in: never the text to speak, never a key.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import uuid
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

_context: ContextVar[dict[str, Any] | None] = ContextVar("chorus_log_context", default=None)

# What a client may send as its own X-Request-Id: short, and safe to put in a
# header, a log line and a database column as is.
REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")


def request_id_from(header: str | None) -> str:
    """The client's request id when it is well formed; a new one otherwise."""
    if header and REQUEST_ID_PATTERN.fullmatch(header):
        return header
    return uuid.uuid4().hex


@contextlib.contextmanager
def log_scope(**fields: Any) -> Iterator[dict[str, Any]]:
    """A fresh context for one request or one task (nested scopes start from
    their parent's fields)."""
    token = _context.set({**(_context.get() or {}), **fields})
    try:
        yield _context.get() or {}
    finally:
        _context.reset(token)


def log_bind(**fields: Any) -> None:
    """Add fields to the current scope; outside any scope, nothing to add to."""
    context = _context.get()
    if context is not None:
        context.update(fields)


def log_field(name: str) -> Any:
    """A field of the current scope (None outside one): the audit trail's request id."""
    return (_context.get() or {}).get(name)


def task_log_context() -> dict[str, str]:
    """What a task published now carries of the context (its `request_id`
    argument): the request's id, when there is a request."""
    request_id = (_context.get() or {}).get("request_id")
    return {"request_id": request_id} if request_id else {}


_make_record = logging.getLogRecordFactory()


def _record_with_context(*args: Any, **kwargs: Any) -> logging.LogRecord:
    """Records take the context when they are made, so a handler that formats
    later, or elsewhere, still has it."""
    record = _make_record(*args, **kwargs)
    context = _context.get()
    if context:
        record.chorus_context = dict(context)
    return record


logging.setLogRecordFactory(_record_with_context)

# Attributes every LogRecord has; anything else came in through `extra=`.
_RECORD_ATTRIBUTES = set(vars(_make_record("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
    "chorus_context",
}


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "message", ...context, ...extra}` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(getattr(record, "chorus_context", {}))
        for name, value in vars(record).items():
            if name not in _RECORD_ATTRIBUTES and not name.startswith("_"):
                entry[name] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str)
