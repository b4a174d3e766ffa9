"""The batch archive: every succeeded item's audio and the manifests, in one zip
built by streaming, on the local backend and on S3 (moto's server on loopback)."""

from __future__ import annotations

import csv
import io
import json
import os
import socket
import subprocess
import sys
import time
import tracemalloc
import zipfile
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from batches.archive import batch_archive_build
from batches.models import ArchiveStatus, Batch
from synthesis.engines.base import Engine
from synthesis.models import Job
from synthesis.services.execution import job_execute
from synthesis.storage_runtime import get_storage
from tests.batches.conftest import run_jobs, submit, waiting_jobs
from tests.conftest import Persona, make_persona
from tests.e2e.conftest import stop_process
from tests.fake_engines import FailingEngine

pytestmark = pytest.mark.django_db(transaction=True)

MB = 1024 * 1024


def _archive(batch: Batch) -> zipfile.ZipFile:
    data = get_storage().get(bucket=batch.tenant.bucket, key=batch.archive_key)
    assert len(data) == batch.archive_bytes
    return zipfile.ZipFile(io.BytesIO(data))


def test_the_archive_holds_every_succeeded_item_and_both_manifests(
    alice: Persona, broker: Any, light_queue: Any, engine: Engine, live_server: Any, settings: Any
) -> None:
    settings.STORAGE = {**settings.STORAGE, "base_url": live_server.url}
    items = [
        {"text": "First of three.", "custom_id": "intro/1", "metadata": {"n": 1}},
        {"text": "Second of three.", "custom_id": "fails"},
        {"text": "Third of three.", "format": "mp3"},
    ]
    body = submit(alice, items).json()
    first, second, third = waiting_jobs(body["id"])
    run_jobs(engine, [first, third])
    job_execute(job_id=second.pk, engine=FailingEngine(engine), worker="w", epoch=second.epoch)  # type: ignore[arg-type]

    assert batch_archive_build(batch_id=body["id"]) == "ready"
    assert batch_archive_build(batch_id=body["id"]) == "skipped"  # a redelivery does nothing

    batch = Batch.objects.select_related("tenant").get(pk=body["id"])
    assert batch.archive_status == ArchiveStatus.READY
    archive = _archive(batch)
    assert archive.testzip() is None  # every entry's CRC checks
    third_id = Job.objects.get(pk=third.pk).pk
    audio_names = ["00000-intro_1.wav", f"00002-{third_id}.mp3"]
    assert archive.namelist() == [*audio_names, "manifest.json", "manifest.csv"]
    for name, job in zip(audio_names, (first, third), strict=True):
        job.refresh_from_db()
        stored = get_storage().get(bucket=alice.tenant.bucket, key=job.output_key)
        assert archive.read(name) == stored
    manifest = json.loads(archive.read("manifest.json"))
    assert manifest["batch_id"] == body["id"]
    assert manifest["status"] == "completed_with_failures"
    rows = manifest["items"]
    assert [(r["index"], r["status"], r["file"]) for r in rows] == [
        (0, "succeeded", audio_names[0]),
        (1, "failed", None),
        (2, "succeeded", audio_names[1]),
    ]
    assert rows[0]["metadata"] == {"n": 1}
    assert rows[1]["error_code"] == "engine_error"
    table = list(csv.DictReader(io.StringIO(archive.read("manifest.csv").decode())))
    assert [(r["index"], r["custom_id"], r["status"], r["file"]) for r in table] == [
        ("0", "intro/1", "succeeded", audio_names[0]),
        ("1", "fails", "failed", ""),
        ("2", "", "succeeded", audio_names[1]),
    ]
    # The manifest's link downloads the same zip, with no API key.
    archive_url = alice.client.get(f"/v1/batches/{body['id']}").json()["archive"]["url"]
    downloaded = httpx.get(archive_url, timeout=10)
    assert downloaded.status_code == 200
    assert downloaded.content == get_storage().get(
        bucket=alice.tenant.bucket, key=batch.archive_key
    )


def test_an_output_expired_before_the_archive_is_listed_without_a_file(
    alice: Persona, broker: Any, light_queue: Any, engine: Engine
) -> None:
    body = submit(alice, [{"text": "Kept."}, {"text": "Gone."}]).json()
    kept, gone = waiting_jobs(body["id"])
    run_jobs(engine, [kept, gone])
    gone.refresh_from_db()
    get_storage().delete(bucket=alice.tenant.bucket, key=gone.output_key)

    assert batch_archive_build(batch_id=body["id"]) == "ready"

    archive = _archive(Batch.objects.select_related("tenant").get(pk=body["id"]))
    rows = json.loads(archive.read("manifest.json"))["items"]
    assert [r["file"] is not None for r in rows] == [True, False]
    assert rows[1]["error_code"] == "output_expired"


def test_a_running_batch_gets_no_archive(alice: Persona, broker: Any) -> None:
    body = submit(alice, [{"text": "Still running."}]).json()

    assert batch_archive_build(batch_id=body["id"]) == "skipped"
    assert Batch.objects.get(pk=body["id"]).archive_status == ArchiveStatus.WAITING


# --- streamed: memory stays bounded however large the batch ------------------------


def _large_finished_batch(persona: Persona, engine: Engine, *, items: int, each: int) -> Batch:
    """A finished batch whose items' stored outputs are `each` bytes: the jobs
    really ran; their objects are then replaced by large ones (as long texts
    would give), so the archive has many megabytes to move."""
    body = submit(persona, [{"text": f"Item {i}."} for i in range(items)]).json()
    jobs = waiting_jobs(body["id"])
    run_jobs(engine, jobs)
    storage = get_storage()
    for job in jobs:
        job.refresh_from_db()
        with storage.writer(bucket=persona.tenant.bucket, key=job.output_key, content_type="") as f:
            for _ in range(each // MB):
                f.write(os.urandom(MB))  # incompressible: the zip is as large as the audio
        Job.objects.filter(pk=job.pk).update(output_bytes=each)
    return Batch.objects.select_related("tenant").get(pk=body["id"])


def _peak_while_building(batch: Batch) -> int:
    tracemalloc.start()
    try:
        assert batch_archive_build(batch_id=batch.pk) == "ready"
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak


def test_a_many_megabyte_archive_is_built_in_bounded_memory_locally(
    alice: Persona, broker: Any, light_queue: Any, engine: Engine
) -> None:
    batch = _large_finished_batch(alice, engine, items=8, each=8 * MB)

    peak = _peak_while_building(batch)

    batch.refresh_from_db()
    assert batch.archive_bytes is not None
    assert batch.archive_bytes > 64 * MB
    print(f"\nlocal archive {batch.archive_bytes / MB:.0f} MiB, peak {peak / MB:.1f} MiB")
    assert peak < 6 * MB  # a few 1 MiB read chunks, not 8 MiB items nor a 64 MiB zip
    archive = _archive(batch)
    assert archive.testzip() is None
    assert len(archive.namelist()) == 8 + 2


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server in a process of its own: it keeps uploads in memory, which
    must not count as this process's (the memory bound is this process's)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(endpoint, timeout=1)
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline, "moto's server did not start"
            time.sleep(0.1)
    yield endpoint
    stop_process(server)  # type: ignore[arg-type]


@pytest.fixture
def s3_alice(settings: Any, s3_endpoint: str, plan: Any) -> Persona:
    settings.STORAGE = {
        **settings.STORAGE,
        "backend": "s3",
        "endpoint_url": s3_endpoint,
        "access_key": "testing",
        "secret_key": "testing",
        "region": "us-east-1",
        "bucket_prefix": "chorus-batch-",
    }
    return make_persona("alice", plan)


def test_the_archive_is_a_multipart_upload_in_bounded_memory_on_s3(
    s3_alice: Persona, broker: Any, light_queue: Any, engine: Engine, s3_endpoint: str
) -> None:
    batch = _large_finished_batch(s3_alice, engine, items=6, each=8 * MB)

    peak = _peak_while_building(batch)

    batch.refresh_from_db()
    assert batch.archive_bytes is not None
    assert batch.archive_bytes > 48 * MB
    print(f"\nS3 archive {batch.archive_bytes / MB:.0f} MiB, peak {peak / MB:.1f} MiB")
    # About one 5 MiB upload part being filled and one being sent, plus read chunks
    # and the client's own buffers: far below the 48 MiB archive, whatever its size.
    assert peak < 20 * MB
    storage: Any = get_storage()
    head = storage.client.head_object(Bucket=batch.tenant.bucket, Key=batch.archive_key)
    assert head["ContentLength"] == batch.archive_bytes
    assert int(head["ETag"].strip('"').rsplit("-", 1)[1]) >= 9  # sent in parts
    archive = _archive(batch)
    assert archive.testzip() is None
    manifest = json.loads(archive.read("manifest.json"))
    for row in manifest["items"]:
        job = Job.objects.get(pk=row["job_id"])
        assert archive.getinfo(row["file"]).file_size == job.output_bytes
    link = s3_alice.client.get(f"/v1/batches/{batch.pk}").json()["archive"]["url"]
    assert link.startswith(f"{s3_endpoint}/{batch.tenant.bucket}/batches/")


def test_a_failed_archive_upload_leaves_no_object_and_says_so(
    s3_alice: Persona, broker: Any, light_queue: Any, engine: Engine, monkeypatch: Any
) -> None:
    batch = _large_finished_batch(s3_alice, engine, items=2, each=MB)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise zipfile.LargeZipFile("stand-in for a failure half-way through")

    monkeypatch.setattr("batches.archive._csv", broken)

    assert batch_archive_build(batch_id=batch.pk) == "failed"

    batch.refresh_from_db()
    assert batch.archive_status == ArchiveStatus.FAILED
    assert "LargeZipFile" in batch.archive_error
    storage: Any = get_storage()
    key = f"batches/{batch.pk}.zip"
    assert not storage.exists(bucket=batch.tenant.bucket, key=key)
    uploads = storage.client.list_multipart_uploads(Bucket=batch.tenant.bucket)
    assert not uploads.get("Uploads")  # aborted, not left billed
    monkeypatch.undo()
    assert batch_archive_build(batch_id=batch.pk) == "ready"  # and it can be built again
