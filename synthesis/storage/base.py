"""One storage interface, two backends (`local`, `s3`).

Each tenant owns one bucket; keys inside it are chosen by the caller and are
deterministic (a retried job overwrites its own object, never another's).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import BinaryIO, Protocol

# Reads and writes in parts of this size keep a large object out of memory; S3
# takes multipart parts of 5 MiB and more (all but the last).
CHUNK_BYTES = 8 * 1024 * 1024


class Storage(Protocol):
    backend: str

    def bucket_for(self, tenant_slug: str) -> str:
        """The bucket name that belongs to a tenant (pure; creates nothing)."""
        ...

    def ensure_bucket(self, bucket: str) -> None:
        """Create the bucket if it does not exist (idempotent)."""

    def check(self) -> None:
        """Raise StorageError unless the store answers now (readiness probes: quick)."""

    def put(self, *, bucket: str, key: str, data: bytes, content_type: str) -> None: ...

    def get(self, *, bucket: str, key: str) -> bytes: ...

    def read_chunks(
        self, *, bucket: str, key: str, chunk_bytes: int = CHUNK_BYTES
    ) -> Iterator[bytes]:
        """The object's bytes in parts of at most `chunk_bytes`; NotFound if missing."""
        ...

    def writer(
        self, *, bucket: str, key: str, content_type: str
    ) -> AbstractContextManager[BinaryIO]:
        """A file to write an object into part by part; the object appears, whole,
        when the block exits without an error, and not at all otherwise."""
        ...

    def copy(self, *, bucket: str, source_key: str, key: str) -> None:
        """Copy an object within a bucket (server-side where the store can); NotFound
        when the source is missing."""

    def exists(self, *, bucket: str, key: str) -> bool: ...

    def delete(self, *, bucket: str, key: str) -> None:
        """Delete an object; deleting a missing object is not an error."""

    def signed_url(
        self, *, bucket: str, key: str, expires_in: int, filename: str | None = None
    ) -> str:
        """A GET link to the object that stops working after `expires_in` seconds."""
        ...
