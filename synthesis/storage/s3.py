"""S3-compatible storage (AWS S3, MinIO, Cloudflare R2) through boto3.

Downloads are presigned GET URLs, so the object store serves the bytes and
enforces expiry itself; nothing passes through the web process.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO, NoReturn, cast
from urllib.parse import quote

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from chorus.errors import NotFound, StorageError
from synthesis.storage.base import CHUNK_BYTES

log = logging.getLogger(__name__)

ADDRESSING_STYLES = ("path", "virtual", "auto")

# SigV4 presigned URLs cannot outlive seven days.
MAX_PRESIGN_SECONDS = 7 * 24 * 3600

_VALID_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")
# Names AWS reserves for its own features; a bucket using them cannot be created.
_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", "--x-s3", "--table-s3")
_HASH_LEN = 10
_MISSING_CODES = {"404", "NoSuchKey", "NotFound", "NoSuchBucket"}


def _is_valid_bucket(name: str) -> bool:
    return (
        bool(_VALID_BUCKET_RE.fullmatch(name))
        and not name.startswith(_RESERVED_PREFIXES)
        and not name.endswith(_RESERVED_SUFFIXES)
    )


def content_disposition(filename: str) -> str:
    """An `attachment` header value that survives non-ASCII names (RFC 6266)."""
    fallback = "".join(
        c if 32 <= ord(c) < 127 and c not in '"\\' else "_" for c in filename
    ).strip()
    header = f'attachment; filename="{fallback or "download"}"'
    if fallback != filename:
        header += f"; filename*=UTF-8''{quote(filename, safe='')}"
    return header


class S3Storage:
    backend = "s3"

    def __init__(
        self,
        *,
        endpoint_url: str | None,
        region: str,
        access_key: str | None,
        secret_key: str | None,
        addressing_style: str = "path",
        bucket_prefix: str = "chorus-",
        public_endpoint_url: str | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        max_attempts: int = 3,
    ) -> None:
        if addressing_style not in ADDRESSING_STYLES:
            raise ValueError(
                f"addressing_style must be one of {', '.join(ADDRESSING_STYLES)}, "
                f"not {addressing_style!r}"
            )
        # Leave room for at least a few slug characters plus the hash suffix.
        if not re.fullmatch(r"(?:[a-z0-9][a-z0-9-]{0,39})?", bucket_prefix):
            raise ValueError(
                f"bucket_prefix {bucket_prefix!r} must be lowercase letters, digits and '-', "
                "start with a letter or digit, and be at most 40 characters"
            )
        self.endpoint_url = endpoint_url or None
        self.public_endpoint_url = public_endpoint_url or None
        self.region = region
        self.addressing_style = addressing_style
        self.bucket_prefix = bucket_prefix
        self._access_key = access_key or None
        self._secret_key = secret_key or None
        self._config = Config(
            signature_version="s3v4",
            s3={"addressing_style": addressing_style},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"max_attempts": max_attempts, "mode": "standard"},
        )
        self._lock = threading.Lock()
        self._client: Any = None
        self._presign_client: Any = None
        self._probe_client: Any = None

    # --- clients --------------------------------------------------------------

    def _make_client(self, endpoint_url: str | None) -> Any:
        # A private Session: boto3's module-level default session is not safe to
        # create clients from concurrently. With no keys given, boto3 falls back
        # to its usual chain (env, profile, instance role).
        session = boto3.session.Session(
            aws_access_key_id=self._access_key,
            aws_secret_access_key=self._secret_key,
            region_name=self.region,
        )
        return session.client("s3", endpoint_url=endpoint_url, config=self._config)

    @property
    def client(self) -> Any:
        """The shared client, built on first use (boto3 clients are thread-safe)."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._make_client(self.endpoint_url)
        return self._client

    @property
    def presign_client(self) -> Any:
        """Signs URLs for the host users reach, which may differ from the workers' one.

        The host is part of the SigV4 signature, so rewriting a URL signed for
        http://minio:9000 into http://localhost:9000 would break it; sign with
        the public endpoint instead.
        """
        if self.public_endpoint_url is None:
            return self.client
        if self._presign_client is None:
            with self._lock:
                if self._presign_client is None:
                    self._presign_client = self._make_client(self.public_endpoint_url)
        return self._presign_client

    def _fail(
        self, exc: Exception, operation: str, bucket: str, key: str | None = None
    ) -> NoReturn:
        where = f"{bucket}/{key}" if key is not None else bucket
        details = {"operation": operation, "bucket": bucket}
        if key is not None:
            details["key"] = key
        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            code = str(error.get("Code", "Unknown"))
            if code in _MISSING_CODES and key is not None:
                raise NotFound(f"Object {where} does not exist.", details=details) from exc
            log.warning("S3 %s on %s failed: %s", operation, where, exc)
            raise StorageError(
                f"Object storage refused {operation} on {where}: {code} "
                f"({error.get('Message') or 'no message'}).",
                details={**details, "s3_code": code},
            ) from exc
        # Connection refused, DNS failure, timeouts, missing credentials, ...
        # The endpoint goes to the log only: error messages can reach end users.
        log.warning("S3 %s on %s via %s failed: %s", operation, where, self.endpoint_url, exc)
        raise StorageError(
            f"Object storage is unavailable ({operation} on {where}: {type(exc).__name__}).",
            details=details,
        ) from exc

    # --- buckets --------------------------------------------------------------

    def bucket_for(self, tenant_slug: str) -> str:
        """A valid S3 bucket name for a tenant.

        A slug that is already a valid name is used as is. Any other slug is
        cleaned up and gets a hash of the original slug appended, so two slugs
        that clean up alike ("Acme", "acme_") still get different buckets.
        """
        if not tenant_slug:
            raise ValueError("tenant slug must not be empty")
        name = f"{self.bucket_prefix}{tenant_slug}"
        if _is_valid_bucket(name):
            return name
        digest = hashlib.sha256(tenant_slug.encode()).hexdigest()[:_HASH_LEN]
        cleaned = re.sub(r"[^a-z0-9-]+", "-", tenant_slug.lower())
        room = 63 - len(self.bucket_prefix) - len(digest) - 1
        stem = f"{self.bucket_prefix}{cleaned[:room]}".strip("-")
        name = f"{stem}-{digest}"
        # Only an empty prefix can still land on a reserved or too-short name.
        return name if _is_valid_bucket(name) else f"b-{digest}"

    def ensure_bucket(self, bucket: str) -> None:
        kwargs: dict[str, Any] = {"Bucket": bucket}
        # us-east-1 rejects an explicit LocationConstraint; R2 uses "auto".
        if self.region not in ("us-east-1", "auto", ""):
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
        try:
            self.client.create_bucket(**kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code == "BucketAlreadyOwnedByYou":
                return
            if code == "BucketAlreadyExists":
                # Some S3-compatible servers say this for our own bucket too;
                # only an account that can read the bucket owns it.
                try:
                    self.client.head_bucket(Bucket=bucket)
                    return
                except (ClientError, BotoCoreError):
                    raise StorageError(
                        f"Bucket {bucket!r} belongs to someone else; choose another bucket prefix.",
                        details={"operation": "create_bucket", "bucket": bucket},
                    ) from exc
            self._fail(exc, "create_bucket", bucket)
        except BotoCoreError as exc:
            self._fail(exc, "create_bucket", bucket)

    def check(self) -> None:
        """Any answer from the endpoint, a refusal included, means it is up: the
        keys may rightly lack the permission to list buckets."""
        if self._probe_client is None:
            probe = Config(
                signature_version="s3v4",
                s3={"addressing_style": self.addressing_style},
                connect_timeout=2,
                read_timeout=2,
                retries={"max_attempts": 1, "mode": "standard"},
            )
            session = boto3.session.Session(
                aws_access_key_id=self._access_key,
                aws_secret_access_key=self._secret_key,
                region_name=self.region,
            )
            self._probe_client = session.client("s3", endpoint_url=self.endpoint_url, config=probe)
        try:
            self._probe_client.list_buckets()
        except ClientError:
            return
        except BotoCoreError as exc:
            self._fail(exc, "check", "-")

    # --- objects --------------------------------------------------------------

    def put(self, *, bucket: str, key: str, data: bytes, content_type: str) -> None:
        try:
            self.client.put_object(Bucket=bucket, Key=key, Body=data, ContentType=content_type)
        except (ClientError, BotoCoreError) as exc:
            # NoSuchBucket here is a deployment bug (no ensure_bucket), not a
            # missing object: report it as storage failure, not NotFound.
            self._fail(exc, "put_object", bucket, None if _is_no_bucket(exc) else key)

    def get(self, *, bucket: str, key: str) -> bytes:
        try:
            response = self.client.get_object(Bucket=bucket, Key=key)
            body: bytes = response["Body"].read()
            return body
        except (ClientError, BotoCoreError) as exc:
            self._fail(exc, "get_object", bucket, key)

    def read_chunks(
        self, *, bucket: str, key: str, chunk_bytes: int = CHUNK_BYTES
    ) -> Iterator[bytes]:
        try:
            body = self.client.get_object(Bucket=bucket, Key=key)["Body"]
            with body:
                yield from body.iter_chunks(chunk_bytes)
        except (ClientError, BotoCoreError) as exc:
            self._fail(exc, "get_object", bucket, key)

    @contextmanager
    def writer(self, *, bucket: str, key: str, content_type: str) -> Iterator[BinaryIO]:
        try:
            upload = self.client.create_multipart_upload(
                Bucket=bucket, Key=key, ContentType=content_type
            )
        except (ClientError, BotoCoreError) as exc:
            self._fail(exc, "create_multipart_upload", bucket, None)
        parts = _MultipartParts(self, bucket=bucket, key=key, upload_id=upload["UploadId"])
        try:
            yield cast(BinaryIO, parts)
            parts.complete()
        except BaseException:
            parts.abort()  # no half-written object, and no parts left billed
            raise

    def copy(self, *, bucket: str, source_key: str, key: str) -> None:
        try:
            self.client.copy_object(
                Bucket=bucket, Key=key, CopySource={"Bucket": bucket, "Key": source_key}
            )
        except (ClientError, BotoCoreError) as exc:
            self._fail(exc, "copy_object", bucket, source_key)

    def exists(self, *, bucket: str, key: str) -> bool:
        try:
            self.client.head_object(Bucket=bucket, Key=key)
            return True
        except ClientError as exc:
            # HEAD responses have no body, so a miss only shows as "404".
            if exc.response.get("Error", {}).get("Code") in _MISSING_CODES:
                return False
            self._fail(exc, "head_object", bucket, key)
        except BotoCoreError as exc:
            self._fail(exc, "head_object", bucket, key)

    def delete(self, *, bucket: str, key: str) -> None:
        try:
            self.client.delete_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            if _is_no_bucket(exc):
                return  # no bucket, no object: nothing to delete
            self._fail(exc, "delete_object", bucket, key)
        except BotoCoreError as exc:
            self._fail(exc, "delete_object", bucket, key)

    def signed_url(
        self, *, bucket: str, key: str, expires_in: int, filename: str | None = None
    ) -> str:
        if not 0 < expires_in <= MAX_PRESIGN_SECONDS:
            raise ValueError(f"expires_in must be between 1 and {MAX_PRESIGN_SECONDS} seconds")
        params: dict[str, str] = {"Bucket": bucket, "Key": key}
        if filename is not None:
            params["ResponseContentDisposition"] = content_disposition(filename)
        try:
            # Signing is local: no request is made, so this cannot hit the network.
            url: str = self.presign_client.generate_presigned_url(
                "get_object", Params=params, ExpiresIn=expires_in
            )
        except BotoCoreError as exc:
            self._fail(exc, "generate_presigned_url", bucket, key)
        return url


# S3's smallest part (all but the last); the most one upload holds in memory.
PART_BYTES = 5 * 1024 * 1024


class _MultipartParts:
    """A write-only file over one multipart upload: what is written is sent in
    parts of about `PART_BYTES`, so about one part is ever held in memory."""

    def __init__(self, storage: S3Storage, *, bucket: str, key: str, upload_id: str) -> None:
        self._storage = storage
        self._where = {"Bucket": bucket, "Key": key, "UploadId": upload_id}
        self._pending: list[bytes] = []
        self._size = 0
        self._parts: list[dict[str, Any]] = []

    def write(self, data: bytes) -> int:
        self._pending.append(bytes(data))
        self._size += len(data)
        if self._size >= PART_BYTES:
            self._send_pending()
        return len(data)

    def _send_pending(self) -> None:
        part = b"".join(self._pending)
        self._pending.clear()
        self._size = 0
        self._send(part)

    def flush(self) -> None:
        """Parts go out when full; S3 refuses parts under 5 MiB but the last."""

    def _send(self, data: bytes) -> None:
        number = len(self._parts) + 1
        try:
            answer = self._storage.client.upload_part(Body=data, PartNumber=number, **self._where)
        except (ClientError, BotoCoreError) as exc:
            self._storage._fail(exc, "upload_part", self._where["Bucket"], self._where["Key"])
        self._parts.append({"ETag": answer["ETag"], "PartNumber": number})

    def complete(self) -> None:
        if self._pending or not self._parts:
            self._send_pending()
        try:
            self._storage.client.complete_multipart_upload(
                MultipartUpload={"Parts": self._parts}, **self._where
            )
        except (ClientError, BotoCoreError) as exc:
            self._storage._fail(
                exc, "complete_multipart_upload", self._where["Bucket"], self._where["Key"]
            )

    def abort(self) -> None:
        try:
            self._storage.client.abort_multipart_upload(**self._where)
        except (ClientError, BotoCoreError):
            log.warning("could not abort the upload of %s", self._where["Key"], exc_info=True)


def _is_no_bucket(exc: Exception) -> bool:
    return (
        isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") == "NoSuchBucket"
    )
