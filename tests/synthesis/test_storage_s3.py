"""S3Storage against a real S3-speaking HTTP server (moto) on loopback.

This exercises the real boto3 client, real HTTP, SigV4 signing and URL
building end to end. moto does NOT check request signatures or presigned-URL
expiry, so those are only checked for presence here; they are enforced by AWS,
MinIO and R2 themselves.
"""

from __future__ import annotations

import socket
import time
import urllib.request
import uuid
from collections.abc import Iterator
from email.message import Message
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from moto.server import ThreadedMotoServer

from chorus.errors import NotFound, StorageError
from synthesis.storage import build_storage
from synthesis.storage.s3 import S3Storage, content_disposition

CREDENTIALS = {"access_key": "testing", "secret_key": "testing"}


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def make_storage(endpoint: str, **options: object) -> S3Storage:
    # A fresh prefix per test: the moto server (and its state) is shared by the module.
    settings: dict[str, object] = {
        "endpoint_url": endpoint,
        "region": "us-east-1",
        "bucket_prefix": f"t{uuid.uuid4().hex[:8]}-",
        "max_attempts": 1,
        **CREDENTIALS,
        **options,
    }
    return S3Storage(**settings)  # type: ignore[arg-type]


@pytest.fixture
def storage(endpoint: str) -> S3Storage:
    return make_storage(endpoint)


@pytest.fixture
def bucket(storage: S3Storage) -> str:
    name = storage.bucket_for("acme")
    storage.ensure_bucket(name)
    return name


def fetch(url: str) -> tuple[bytes, Message]:
    """GET a URL with a client that knows nothing about S3 (as a browser would)."""
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read(), response.headers


def test_round_trip(storage: S3Storage, bucket: str) -> None:
    key = "jobs/2024/job-1.wav"
    assert not storage.exists(bucket=bucket, key=key)
    storage.put(bucket=bucket, key=key, data=b"RIFF....", content_type="audio/wav")
    assert storage.exists(bucket=bucket, key=key)
    assert storage.get(bucket=bucket, key=key) == b"RIFF...."
    storage.put(bucket=bucket, key=key, data=b"new", content_type="audio/wav")
    assert storage.get(bucket=bucket, key=key) == b"new"
    storage.delete(bucket=bucket, key=key)
    assert not storage.exists(bucket=bucket, key=key)
    storage.delete(bucket=bucket, key=key)  # deleting a missing object is fine


def test_client_is_built_once(storage: S3Storage) -> None:
    assert storage.client is storage.client
    assert storage.presign_client is storage.client


def test_missing_key_is_not_found(storage: S3Storage, bucket: str) -> None:
    with pytest.raises(NotFound):
        storage.get(bucket=bucket, key="nope.wav")


def test_missing_bucket(storage: S3Storage) -> None:
    ghost = storage.bucket_for("ghost")
    with pytest.raises(NotFound):
        storage.get(bucket=ghost, key="a.wav")
    assert not storage.exists(bucket=ghost, key="a.wav")
    storage.delete(bucket=ghost, key="a.wav")
    # Writing without ensure_bucket() is a setup bug, not a missing object.
    with pytest.raises(StorageError, match="NoSuchBucket") as info:
        storage.put(bucket=ghost, key="a.wav", data=b"x", content_type="audio/wav")
    assert not isinstance(info.value, NotFound)


def test_ensure_bucket_is_idempotent(storage: S3Storage) -> None:
    name = storage.bucket_for("acme")
    storage.ensure_bucket(name)
    storage.ensure_bucket(name)
    storage.client.head_bucket(Bucket=name)


def test_ensure_bucket_outside_us_east_1(endpoint: str) -> None:
    # moto, like AWS, insists on a LocationConstraint everywhere but us-east-1.
    storage = make_storage(endpoint, region="eu-west-1")
    name = storage.bucket_for("acme")
    storage.ensure_bucket(name)
    storage.ensure_bucket(name)
    location = storage.client.get_bucket_location(Bucket=name)["LocationConstraint"]
    assert location == "eu-west-1"


def test_tenants_are_isolated(storage: S3Storage) -> None:
    a, b = storage.bucket_for("acme"), storage.bucket_for("globex")
    assert a != b
    for name in (a, b):
        storage.ensure_bucket(name)
    storage.put(bucket=a, key="out.wav", data=b"acme", content_type="audio/wav")
    assert not storage.exists(bucket=b, key="out.wav")
    with pytest.raises(NotFound):
        storage.get(bucket=b, key="out.wav")


@pytest.mark.parametrize(
    ("slug", "expected"),
    [
        ("acme", "chorus-acme"),
        ("acme-2", "chorus-acme-2"),
    ],
)
def test_bucket_for_keeps_valid_slugs(slug: str, expected: str) -> None:
    storage = S3Storage(endpoint_url=None, region="us-east-1", access_key=None, secret_key=None)
    assert storage.bucket_for(slug) == expected


@pytest.mark.parametrize(
    "slug",
    ["Acme", "acme_corp", "acme.corp", "ACME Corp!", "a" * 100, "-acme-", "ü", "acme-s3alias"],
)
def test_bucket_for_sanitizes(slug: str) -> None:
    storage = S3Storage(endpoint_url=None, region="us-east-1", access_key=None, secret_key=None)
    name = storage.bucket_for(slug)
    assert 3 <= len(name) <= 63
    assert name.startswith("chorus-")
    assert all(c.islower() or c.isdigit() or c == "-" for c in name)
    assert name[-1].isalnum()
    assert storage.bucket_for(slug) == name  # deterministic


def test_bucket_for_keeps_distinct_slugs_distinct() -> None:
    storage = S3Storage(endpoint_url=None, region="us-east-1", access_key=None, secret_key=None)
    slugs = ["acme", "Acme", "acme_", "acme.", "a" * 100, "a" * 101, "a" * 100 + "b"]
    assert len({storage.bucket_for(s) for s in slugs}) == len(slugs)


def test_sanitized_buckets_really_work(storage: S3Storage) -> None:
    name = storage.bucket_for("Weird_Tenant.Name" + "x" * 80)
    storage.ensure_bucket(name)
    storage.put(bucket=name, key="k", data=b"ok", content_type="text/plain")
    assert storage.get(bucket=name, key="k") == b"ok"


def test_presigned_url(storage: S3Storage, bucket: str) -> None:
    storage.put(bucket=bucket, key="jobs/out.wav", data=b"audio!", content_type="audio/wav")
    url = storage.signed_url(bucket=bucket, key="jobs/out.wav", expires_in=600)
    query = parse_qs(urlsplit(url).query)
    assert query["X-Amz-Expires"] == ["600"]
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"]
    assert len(query["X-Amz-Signature"][0]) == 64
    assert "response-content-disposition" not in query
    body, headers = fetch(url)
    assert body == b"audio!"
    assert headers["Content-Type"] == "audio/wav"


def test_presigned_url_with_filename(storage: S3Storage, bucket: str) -> None:
    storage.put(bucket=bucket, key="out.wav", data=b"audio!", content_type="audio/wav")
    url = storage.signed_url(bucket=bucket, key="out.wav", expires_in=60, filename="Grüße.wav")
    body, headers = fetch(url)
    assert body == b"audio!"
    assert headers["Content-Disposition"] == content_disposition("Grüße.wav")
    assert headers["Content-Disposition"].startswith('attachment; filename="Gr__e.wav"')


def test_presigned_url_uses_public_endpoint(endpoint: str) -> None:
    # Workers talk to 127.0.0.1, users to "localhost": the link must name (and
    # be signed for) the host users reach.
    public = endpoint.replace("127.0.0.1", "localhost")
    storage = make_storage(endpoint, public_endpoint_url=public)
    name = storage.bucket_for("acme")
    storage.ensure_bucket(name)
    storage.put(bucket=name, key="a.wav", data=b"hi", content_type="audio/wav")
    url = storage.signed_url(bucket=name, key="a.wav", expires_in=60)
    assert url.startswith(f"{public}/{name}/a.wav?")
    assert storage.presign_client is not storage.client
    assert fetch(url)[0] == b"hi"


@pytest.mark.parametrize("expires_in", [0, -1, 7 * 24 * 3600 + 1])
def test_presign_lifetime_is_bounded(storage: S3Storage, expires_in: int) -> None:
    with pytest.raises(ValueError, match="expires_in"):
        storage.signed_url(bucket="chorus-acme", key="a", expires_in=expires_in)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_endpoint_is_storage_error() -> None:
    storage = S3Storage(
        endpoint_url=f"http://127.0.0.1:{closed_port()}",
        region="us-east-1",
        connect_timeout=0.5,
        read_timeout=0.5,
        max_attempts=1,
        **CREDENTIALS,
    )
    started = time.monotonic()
    for call in (
        lambda: storage.ensure_bucket("chorus-acme"),
        lambda: storage.put(bucket="chorus-acme", key="a", data=b"x", content_type="text/plain"),
        lambda: storage.get(bucket="chorus-acme", key="a"),
        lambda: storage.exists(bucket="chorus-acme", key="a"),
        lambda: storage.delete(bucket="chorus-acme", key="a"),
    ):
        with pytest.raises(StorageError, match="unavailable") as info:
            call()
        assert info.value.status == 503
    assert time.monotonic() - started < 10


def test_bad_addressing_style() -> None:
    with pytest.raises(ValueError, match="path, virtual, auto"):
        S3Storage(
            endpoint_url=None,
            region="us-east-1",
            access_key=None,
            secret_key=None,
            addressing_style="sideways",
        )


def test_build_storage_s3(endpoint: str) -> None:
    storage = build_storage(
        {
            "backend": "s3",
            "endpoint_url": endpoint,
            "region": "us-east-1",
            "access_key": "testing",
            "secret_key": "testing",
            "addressing_style": "path",
            "public_endpoint_url": "",
            "bucket_prefix": "built-",
            "max_attempts": "1",
        }
    )
    assert isinstance(storage, S3Storage)
    assert storage.backend == "s3"
    assert storage.public_endpoint_url is None
    name = storage.bucket_for("acme")
    assert name == "built-acme"
    storage.ensure_bucket(name)
    storage.put(bucket=name, key="k", data=b"v", content_type="text/plain")
    assert storage.get(bucket=name, key="k") == b"v"


# --- streamed reads and writes, copies ----------------------------------------------


def test_an_object_is_read_in_chunks(storage: S3Storage, bucket: str) -> None:
    storage.put(bucket=bucket, key="a.wav", data=b"0123456789", content_type="audio/wav")

    assert list(storage.read_chunks(bucket=bucket, key="a.wav", chunk_bytes=4)) == [
        b"0123",
        b"4567",
        b"89",
    ]
    with pytest.raises(NotFound):
        list(storage.read_chunks(bucket=bucket, key="missing.wav"))


def test_a_large_object_is_written_as_a_multipart_upload(storage: S3Storage, bucket: str) -> None:
    from synthesis.storage.s3 import PART_BYTES

    pieces = [bytes([n]) * (1024 * 1024) for n in range(12)]
    with storage.writer(bucket=bucket, key="z.zip", content_type="application/zip") as out:
        for piece in pieces:
            out.write(piece)
        assert not storage.exists(bucket=bucket, key="z.zip")

    assert storage.get(bucket=bucket, key="z.zip") == b"".join(pieces)
    head = storage.client.head_object(Bucket=bucket, Key="z.zip")
    assert head["ContentType"] == "application/zip"
    parts = int(head["ETag"].strip('"').rsplit("-", 1)[1])
    assert parts == -(-12 * 1024 * 1024 // PART_BYTES)


def test_a_small_object_written_part_by_part_is_one_part(storage: S3Storage, bucket: str) -> None:
    with storage.writer(bucket=bucket, key="s.zip", content_type="application/zip") as out:
        out.write(b"tiny")

    assert storage.get(bucket=bucket, key="s.zip") == b"tiny"


def test_a_writer_that_fails_aborts_its_upload(storage: S3Storage, bucket: str) -> None:
    with pytest.raises(RuntimeError):
        _stopped_half_way(storage, bucket, "z.zip", b"x" * (6 * 1024 * 1024))

    assert not storage.exists(bucket=bucket, key="z.zip")
    assert not storage.client.list_multipart_uploads(Bucket=bucket).get("Uploads")


def test_a_copy_is_server_side_and_an_object_of_its_own(storage: S3Storage, bucket: str) -> None:
    storage.put(bucket=bucket, key="speech/a.wav", data=b"audio", content_type="audio/wav")

    storage.copy(bucket=bucket, source_key="speech/a.wav", key="speech/b.wav")
    storage.delete(bucket=bucket, key="speech/a.wav")

    assert storage.get(bucket=bucket, key="speech/b.wav") == b"audio"
    with pytest.raises(NotFound):
        storage.copy(bucket=bucket, source_key="speech/a.wav", key="speech/c.wav")


def _stopped_half_way(storage: Any, bucket: str, key: str, data: bytes) -> None:
    with storage.writer(bucket=bucket, key=key, content_type="application/zip") as out:
        out.write(data)
        raise RuntimeError("stopped half-way")
