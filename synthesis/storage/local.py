"""Filesystem storage: one folder per tenant bucket, downloads via HMAC-signed links.

Used for single-machine installs and tests. The signed link points at a Django
view (`/v1/files/<bucket>/<key>`) that calls `verify()` and then `path_for()`;
the signature covers the bucket and the key, so editing either one in a link
for one tenant's object can never yield another tenant's object.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote, urlencode

from chorus.errors import ChorusError, NotFound, StorageError
from synthesis.storage.base import CHUNK_BYTES


class LinkInvalid(ChorusError):
    # A forged or edited link answers exactly like a missing object, so probing
    # links reveals nothing about which buckets or keys exist.
    status = 404
    code = "not_found"

    def __init__(self) -> None:
        super().__init__("This download link is not valid.")


class LinkExpired(ChorusError):
    status = 410
    code = "link_expired"

    def __init__(self) -> None:
        super().__init__("This download link has expired.")


# Bumping the version invalidates every link issued before, and keeps these
# MACs from ever colliding with other uses of the same secret.
_SIGNING_DOMAIN = "chorus.local-storage.download.v1"

# ASCII only: `str.isdigit()` would also accept e.g. Arabic-Indic digits.
_EXPIRES_RE = re.compile(r"[0-9]{1,12}")
_SIGNATURE_RE = re.compile(r"[0-9a-f]{64}")
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")


def _check_bucket(bucket: str) -> None:
    # A bucket is exactly one path segment; ".." and friends are excluded by
    # the pattern (it must start with a letter or digit and has no separators).
    if not _BUCKET_RE.fullmatch(bucket):
        raise ValueError(f"invalid bucket name {bucket!r}")


def _key_parts(key: str) -> list[str]:
    """Split a key into path segments, refusing anything that could leave the bucket.

    Segments may not start with "." : that excludes "." and "..", and reserves
    dot-names for the temp files that `put` writes next to the final object.
    """
    if not key or len(key) > 1024:
        raise ValueError("object key must be 1-1024 characters")
    if "\\" in key or key.startswith("/") or any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise ValueError(f"invalid object key {key!r}")
    parts = key.split("/")
    if any(not part or part.startswith(".") for part in parts):
        raise ValueError(f"invalid object key {key!r}")
    return parts


class LocalStorage:
    backend = "local"

    def __init__(
        self, root: Path, *, secret: str, base_url: str, bucket_prefix: str = "chorus-"
    ) -> None:
        if not secret:
            raise ValueError("LocalStorage needs a non-empty signing secret")
        self.root = Path(root)
        self.base_url = base_url.rstrip("/")
        self.bucket_prefix = bucket_prefix
        self._secret = secret.encode()

    # --- buckets and paths ----------------------------------------------------

    def bucket_for(self, tenant_slug: str) -> str:
        bucket = f"{self.bucket_prefix}{tenant_slug}"
        _check_bucket(bucket)
        return bucket

    def path_for(self, bucket: str, key: str) -> Path:
        """Where an object lives on disk (whether or not it exists yet)."""
        _check_bucket(bucket)
        path = self.root.joinpath(bucket, *_key_parts(key))
        # Belt and braces: a symlink planted inside the tree must not lead out of it.
        bucket_dir = (self.root / bucket).resolve()
        if not path.resolve().is_relative_to(bucket_dir):
            raise ValueError(f"object key {key!r} resolves outside its bucket")
        return path

    def ensure_bucket(self, bucket: str) -> None:
        _check_bucket(bucket)
        try:
            (self.root / bucket).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"Could not create bucket {bucket!r}: {exc.strerror}") from exc

    def check(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"Could not create the storage folder: {exc.strerror}") from exc
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise StorageError("The storage folder is not writable.")

    # --- objects --------------------------------------------------------------

    def put(self, *, bucket: str, key: str, data: bytes, content_type: str) -> None:
        # content_type is not stored: the download view infers it from the key's
        # extension, as a plain file server would.
        with self.writer(bucket=bucket, key=key, content_type=content_type) as fh:
            fh.write(data)

    def get(self, *, bucket: str, key: str) -> bytes:
        path = self.path_for(bucket, key)
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise NotFound(f"Object {bucket}/{key} does not exist.") from exc
        except OSError as exc:
            raise StorageError(f"Could not read {bucket}/{key}: {exc.strerror}") from exc

    def read_chunks(
        self, *, bucket: str, key: str, chunk_bytes: int = CHUNK_BYTES
    ) -> Iterator[bytes]:
        path = self.path_for(bucket, key)
        try:
            fh = path.open("rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise NotFound(f"Object {bucket}/{key} does not exist.") from exc
        except OSError as exc:
            raise StorageError(f"Could not read {bucket}/{key}: {exc.strerror}") from exc
        with fh:
            while chunk := fh.read(chunk_bytes):
                yield chunk

    @contextmanager
    def writer(self, *, bucket: str, key: str, content_type: str) -> Iterator[BinaryIO]:
        path = self.path_for(bucket, key)
        if not (self.root / bucket).is_dir():
            # Same behaviour as S3 (NoSuchBucket), so a missing ensure_bucket()
            # is caught in local development too.
            raise StorageError(f"Bucket {bucket!r} does not exist.")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # A temp file in the same folder, renamed into place once complete
            # (a same-filesystem os.replace): readers see the old object or the
            # new one, never a part.
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        except OSError as exc:
            raise StorageError(f"Could not write {bucket}/{key}: {exc.strerror}") from exc
        try:
            with os.fdopen(fd, "wb") as fh:
                yield fh
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            raise StorageError(f"Could not write {bucket}/{key}: {exc.strerror}") from exc
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def copy(self, *, bucket: str, source_key: str, key: str) -> None:
        source = self.path_for(bucket, source_key)
        try:
            src = source.open("rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise NotFound(f"Object {bucket}/{source_key} does not exist.") from exc
        except OSError as exc:
            raise StorageError(f"Could not read {bucket}/{source_key}: {exc.strerror}") from exc
        with src, self.writer(bucket=bucket, key=key, content_type="") as dst:
            shutil.copyfileobj(src, dst, CHUNK_BYTES)

    def exists(self, *, bucket: str, key: str) -> bool:
        return self.path_for(bucket, key).is_file()

    def delete(self, *, bucket: str, key: str) -> None:
        path = self.path_for(bucket, key)
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise StorageError(f"Could not delete {bucket}/{key}: {exc.strerror}") from exc

    # --- signed links -----------------------------------------------------------

    def _signature(self, bucket: str, key: str, expires: str, filename: str | None) -> str:
        # JSON framing makes the message unambiguous (no field can absorb a
        # separator from its neighbour) and tells "no filename" (null) from "".
        message = json.dumps([_SIGNING_DOMAIN, bucket, key, expires, filename])
        return hmac.new(self._secret, message.encode(), hashlib.sha256).hexdigest()

    def signed_url(
        self, *, bucket: str, key: str, expires_in: int, filename: str | None = None
    ) -> str:
        if isinstance(expires_in, bool) or not isinstance(expires_in, int) or expires_in <= 0:
            raise ValueError("expires_in must be a positive number of seconds")
        self.path_for(bucket, key)  # refuse to sign a link that could never be served
        expires = str(int(time.time()) + expires_in)
        query = {"expires": expires}
        if filename is not None:
            query["filename"] = filename
        query["signature"] = self._signature(bucket, key, expires, filename)
        path = f"{quote(bucket, safe='')}/{quote(key, safe='/')}"
        return f"{self.base_url}/v1/files/{path}?{urlencode(query)}"

    def verify(
        self,
        *,
        bucket: str,
        key: str,
        expires: str,
        signature: str,
        filename: str | None,
        now: float | None = None,
    ) -> None:
        """Check a link's query parameters; raise LinkInvalid or LinkExpired.

        The signature is checked before the expiry, so a forged link is always
        "not valid" and only an authentic one can be reported as expired.
        """
        if not _EXPIRES_RE.fullmatch(expires) or not _SIGNATURE_RE.fullmatch(signature):
            raise LinkInvalid()
        expected = self._signature(bucket, key, expires, filename)
        if not hmac.compare_digest(expected, signature):
            raise LinkInvalid()
        try:
            self.path_for(bucket, key)
        except ValueError:
            # Unreachable with links we signed, but never hand the view a bad path.
            raise LinkInvalid() from None
        if int(expires) <= (time.time() if now is None else now):
            raise LinkExpired()
