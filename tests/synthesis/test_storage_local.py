"""LocalStorage: atomic writes, path safety and HMAC-signed download links."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from chorus.errors import NotFound, StorageError
from synthesis.storage import build_storage
from synthesis.storage.local import LinkExpired, LinkInvalid, LocalStorage

BASE_URL = "https://chorus.example"


@pytest.fixture
def storage(tmp_path: Path) -> LocalStorage:
    return LocalStorage(tmp_path / "data", secret="s3cret-for-tests", base_url=BASE_URL + "/")


@pytest.fixture
def bucket(storage: LocalStorage) -> str:
    name = storage.bucket_for("acme")
    storage.ensure_bucket(name)
    return name


def parse_link(url: str) -> dict[str, str | None]:
    """Split a link the way the download view will see it (path + query)."""
    parts = urlsplit(url)
    assert f"{parts.scheme}://{parts.netloc}" == BASE_URL
    prefix = "/v1/files/"
    assert parts.path.startswith(prefix)
    bucket, _, key = parts.path[len(prefix) :].partition("/")
    query = {name: values[0] for name, values in parse_qs(parts.query).items()}
    return {
        "bucket": unquote(bucket),
        "key": unquote(key),
        "expires": query["expires"],
        "signature": query["signature"],
        "filename": query.get("filename"),
    }


def verify(storage: LocalStorage, link: dict[str, str | None], now: float | None = None) -> None:
    storage.verify(
        bucket=str(link["bucket"]),
        key=str(link["key"]),
        expires=str(link["expires"]),
        signature=str(link["signature"]),
        filename=link["filename"],
        now=now,
    )


# --- objects ------------------------------------------------------------------


def test_round_trip_with_nested_key(storage: LocalStorage, bucket: str) -> None:
    key = "jobs/2024/job-1.wav"
    assert not storage.exists(bucket=bucket, key=key)
    storage.put(bucket=bucket, key=key, data=b"RIFF....", content_type="audio/wav")
    assert storage.exists(bucket=bucket, key=key)
    assert storage.get(bucket=bucket, key=key) == b"RIFF...."
    assert storage.path_for(bucket, key) == storage.root / "chorus-acme/jobs/2024/job-1.wav"

    storage.put(bucket=bucket, key=key, data=b"new", content_type="audio/wav")
    assert storage.get(bucket=bucket, key=key) == b"new"

    storage.delete(bucket=bucket, key=key)
    assert not storage.exists(bucket=bucket, key=key)
    storage.delete(bucket=bucket, key=key)  # deleting a missing object is fine


def test_missing_object_is_not_found(storage: LocalStorage, bucket: str) -> None:
    with pytest.raises(NotFound):
        storage.get(bucket=bucket, key="nope.wav")
    with pytest.raises(NotFound):
        storage.get(bucket=storage.bucket_for("ghost"), key="nope.wav")


def test_put_without_bucket_fails_like_s3(storage: LocalStorage) -> None:
    with pytest.raises(StorageError):
        storage.put(bucket="chorus-ghost", key="a.wav", data=b"x", content_type="audio/wav")


def test_ensure_bucket_is_idempotent(storage: LocalStorage) -> None:
    storage.ensure_bucket("chorus-acme")
    storage.ensure_bucket("chorus-acme")
    assert (storage.root / "chorus-acme").is_dir()


def test_tenants_are_isolated(storage: LocalStorage) -> None:
    a, b = storage.bucket_for("acme"), storage.bucket_for("globex")
    for name in (a, b):
        storage.ensure_bucket(name)
    storage.put(bucket=a, key="out.wav", data=b"acme", content_type="audio/wav")
    assert not storage.exists(bucket=b, key="out.wav")
    with pytest.raises(NotFound):
        storage.get(bucket=b, key="out.wav")


def test_write_is_atomic(storage: LocalStorage, bucket: str) -> None:
    """Readers racing a writer only ever see a whole old or whole new object."""
    key = "race.bin"
    old, new = b"a" * 1_000_000, b"b" * 2_000_000
    storage.put(bucket=bucket, key=key, data=old, content_type="application/octet-stream")
    seen: set[bytes] = set()
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            seen.add(storage.get(bucket=bucket, key=key))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(20):
            data = new if i % 2 == 0 else old
            storage.put(bucket=bucket, key=key, data=data, content_type="application/octet-stream")
    finally:
        stop.set()
        thread.join()
    assert seen <= {old, new}
    # No temp files are left behind next to the object.
    assert os.listdir(storage.root / bucket) == [key]


def test_failed_write_keeps_old_object_and_no_temp_file(
    storage: LocalStorage, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage.put(bucket=bucket, key="a.wav", data=b"old", content_type="audio/wav")

    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(StorageError, match="No space left"):
        storage.put(bucket=bucket, key="a.wav", data=b"new", content_type="audio/wav")
    monkeypatch.undo()
    assert storage.get(bucket=bucket, key="a.wav") == b"old"
    assert os.listdir(storage.root / bucket) == ["a.wav"]


@pytest.mark.parametrize(
    "key",
    [
        "../chorus-globex/out.wav",
        "a/../../etc/passwd",
        "..",
        ".",
        "/etc/passwd",
        "a\\..\\b",
        "a\x00b",
        "a//b",
        "a/",
        "",
        ".hidden",
        "line\nbreak",
    ],
)
def test_escaping_keys_are_rejected(storage: LocalStorage, bucket: str, key: str) -> None:
    with pytest.raises(ValueError, match="object key"):
        storage.put(bucket=bucket, key=key, data=b"x", content_type="audio/wav")
    with pytest.raises(ValueError, match="object key"):
        storage.path_for(bucket, key)
    with pytest.raises(ValueError, match="object key"):
        storage.signed_url(bucket=bucket, key=key, expires_in=60)


@pytest.mark.parametrize("bucket", ["..", "a/b", "", "/abs", "a\\b", "UPPER"])
def test_bad_bucket_names_are_rejected(storage: LocalStorage, bucket: str) -> None:
    with pytest.raises(ValueError, match="invalid bucket name"):
        storage.path_for(bucket, "a.wav")
    with pytest.raises(ValueError, match="invalid bucket name"):
        storage.ensure_bucket(bucket)


def test_bad_slug_is_rejected(storage: LocalStorage) -> None:
    with pytest.raises(ValueError, match="invalid bucket name"):
        storage.bucket_for("../evil")


def test_symlink_out_of_the_bucket_is_rejected(
    storage: LocalStorage, bucket: str, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (storage.root / bucket / "link").symlink_to(outside)
    with pytest.raises(ValueError, match="outside its bucket"):
        storage.path_for(bucket, "link/secret.txt")


# --- signed links -------------------------------------------------------------


def test_signed_url_format_and_verification(storage: LocalStorage, bucket: str) -> None:
    url = storage.signed_url(bucket=bucket, key="jobs/a b.wav", expires_in=300, filename="Hi é.wav")
    assert url.startswith(f"{BASE_URL}/v1/files/{bucket}/jobs/a%20b.wav?expires=")
    link = parse_link(url)
    assert link["key"] == "jobs/a b.wav"
    assert link["filename"] == "Hi é.wav"
    verify(storage, link)  # does not raise


def test_signed_url_without_filename(storage: LocalStorage, bucket: str) -> None:
    url = storage.signed_url(bucket=bucket, key="a.wav", expires_in=60)
    link = parse_link(url)
    assert link["filename"] is None
    verify(storage, link)
    # Adding a filename to a link signed without one is tampering too.
    with pytest.raises(LinkInvalid):
        verify(storage, {**link, "filename": ""})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("bucket", "chorus-globex"),
        ("key", "b.wav"),
        ("key", "a.wav/../a.wav"),
        ("expires", "9999999999"),
        ("filename", "evil.exe"),
        ("signature", "0" * 64),
        ("signature", ""),
        ("signature", "é" * 64),  # non-ASCII must not crash compare_digest
        ("expires", "+1"),
        ("expires", "1e9"),
        ("expires", "١٢٣"),  # Arabic-Indic digits pass str.isdigit()
        ("expires", ""),
    ],
)
def test_tampered_links_are_invalid(
    storage: LocalStorage, bucket: str, field: str, value: str
) -> None:
    link = parse_link(storage.signed_url(bucket=bucket, key="a.wav", expires_in=60, filename="x"))
    with pytest.raises(LinkInvalid) as info:
        verify(storage, {**link, field: value})
    # Indistinguishable from a missing object.
    assert info.value.status == 404
    assert info.value.code == "not_found"
    assert info.value.message == "This download link is not valid."


def test_signature_case_change_is_invalid(storage: LocalStorage, bucket: str) -> None:
    link = parse_link(storage.signed_url(bucket=bucket, key="a.wav", expires_in=60))
    with pytest.raises(LinkInvalid):
        verify(storage, {**link, "signature": str(link["signature"]).upper()})


def test_expired_link(storage: LocalStorage, bucket: str) -> None:
    link = parse_link(storage.signed_url(bucket=bucket, key="a.wav", expires_in=60))
    expires = int(str(link["expires"]))
    verify(storage, link, now=expires - 1)
    with pytest.raises(LinkExpired) as info:
        verify(storage, link, now=expires)
    assert info.value.status == 410
    assert info.value.code == "link_expired"


def test_forged_expired_link_is_invalid_not_expired(storage: LocalStorage, bucket: str) -> None:
    link = parse_link(storage.signed_url(bucket=bucket, key="a.wav", expires_in=60))
    with pytest.raises(LinkInvalid):
        verify(storage, {**link, "expires": "1"}, now=10)


def test_links_do_not_verify_under_another_secret(
    storage: LocalStorage, bucket: str, tmp_path: Path
) -> None:
    other = LocalStorage(storage.root, secret="another-secret", base_url=BASE_URL)
    link = parse_link(storage.signed_url(bucket=bucket, key="a.wav", expires_in=60))
    with pytest.raises(LinkInvalid):
        verify(other, link)


@pytest.mark.parametrize("expires_in", [0, -5])
def test_non_positive_lifetime_is_rejected(
    storage: LocalStorage, bucket: str, expires_in: int
) -> None:
    with pytest.raises(ValueError, match="expires_in"):
        storage.signed_url(bucket=bucket, key="a.wav", expires_in=expires_in)


def test_empty_secret_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="secret"):
        LocalStorage(tmp_path, secret="", base_url=BASE_URL)


# --- factory ------------------------------------------------------------------


def test_build_storage_local(tmp_path: Path) -> None:
    storage = build_storage(
        {
            "backend": "local",
            "local_root": str(tmp_path),
            "secret": "x",
            "base_url": BASE_URL,
            "bucket_prefix": "t-",
        }
    )
    assert isinstance(storage, LocalStorage)
    assert storage.backend == "local"
    assert storage.bucket_for("acme") == "t-acme"


def test_build_storage_rejects_unknown_backend() -> None:
    with pytest.raises(ValueError, match="local, s3"):
        build_storage({"backend": "ftp"})


def test_build_storage_names_missing_option() -> None:
    with pytest.raises(ValueError, match="secret"):
        build_storage({"backend": "local", "local_root": "/tmp/x", "base_url": BASE_URL})


# --- streamed reads and writes, copies ----------------------------------------------


def test_an_object_is_read_in_chunks(storage: LocalStorage, bucket: str) -> None:
    storage.put(bucket=bucket, key="a/b.wav", data=b"0123456789", content_type="audio/wav")

    assert list(storage.read_chunks(bucket=bucket, key="a/b.wav", chunk_bytes=4)) == [
        b"0123",
        b"4567",
        b"89",
    ]
    with pytest.raises(NotFound):
        list(storage.read_chunks(bucket=bucket, key="a/missing.wav"))


def test_a_written_object_appears_whole_only_when_the_writer_closes(
    storage: LocalStorage, bucket: str
) -> None:
    with storage.writer(bucket=bucket, key="z/archive.zip", content_type="") as out:
        out.write(b"part one, ")
        assert not storage.exists(bucket=bucket, key="z/archive.zip")
        out.write(b"part two")

    assert storage.get(bucket=bucket, key="z/archive.zip") == b"part one, part two"


def test_a_writer_that_fails_leaves_no_object_and_no_temp_file(
    storage: LocalStorage, bucket: str
) -> None:
    with pytest.raises(RuntimeError):
        _stopped_half_way(storage, bucket, "z/archive.zip", b"half")

    assert not storage.exists(bucket=bucket, key="z/archive.zip")
    assert list((storage.root / bucket / "z").iterdir()) == []


def test_a_copy_is_an_object_of_its_own(storage: LocalStorage, bucket: str) -> None:
    storage.put(bucket=bucket, key="speech/a.wav", data=b"audio", content_type="audio/wav")

    storage.copy(bucket=bucket, source_key="speech/a.wav", key="speech/b.wav")
    storage.delete(bucket=bucket, key="speech/a.wav")

    assert storage.get(bucket=bucket, key="speech/b.wav") == b"audio"
    with pytest.raises(NotFound):
        storage.copy(bucket=bucket, source_key="speech/a.wav", key="speech/c.wav")
    assert not storage.exists(bucket=bucket, key="speech/c.wav")


def _stopped_half_way(storage: Any, bucket: str, key: str, data: bytes) -> None:
    with storage.writer(bucket=bucket, key=key, content_type="application/zip") as out:
        out.write(data)
        raise RuntimeError("stopped half-way")
