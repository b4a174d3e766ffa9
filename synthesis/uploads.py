"""Upload limits that hold while the body streams in, not after it has landed.

The view refuses an upload whose Content-Length is over the plan's limit before
reading anything. A body without a usable length (chunked) is counted as it is
parsed, and parsing stops with 413 as soon as it passes the limit
(`quotas.body_limits.upload_limit_bytes`, where every size limit comes from).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.core.files.uploadhandler import FileUploadHandler

from chorus.errors import FileTooLarge

_limit: contextvars.ContextVar[int | None] = contextvars.ContextVar("upload_limit", default=None)


@contextmanager
def upload_limit(limit_bytes: int) -> Iterator[None]:
    token = _limit.set(limit_bytes)
    try:
        yield
    finally:
        _limit.reset(token)


class LimitedUploadHandler(FileUploadHandler):
    """First in the handler chain: counts file bytes and stops at the limit."""

    def __init__(self, request: Any = None) -> None:
        super().__init__(request)
        self.received = 0

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes:
        self.received += len(raw_data)
        limit = _limit.get()
        if limit is not None and self.received > limit:
            raise FileTooLarge(
                f"The upload is larger than your plan's limit of {limit} bytes.",
                details={"limit_bytes": limit, "size_bytes_at_least": self.received},
            )
        return raw_data

    def file_complete(self, file_size: int) -> None:
        return None
