"""One storage interface, two backends (`local`, `s3`).

Each tenant owns one bucket; keys inside it are chosen by the caller and are
deterministic (a retried job overwrites its own object, never another's).
"""

from __future__ import annotations

from typing import Protocol


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

    def exists(self, *, bucket: str, key: str) -> bool: ...

    def delete(self, *, bucket: str, key: str) -> None:
        """Delete an object; deleting a missing object is not an error."""

    def signed_url(
        self, *, bucket: str, key: str, expires_in: int, filename: str | None = None
    ) -> str:
        """A GET link to the object that stops working after `expires_in` seconds."""
        ...
