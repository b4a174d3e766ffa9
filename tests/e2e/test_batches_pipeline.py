"""A batch, for real: HTTP → PostgreSQL → Redis → a synthesis worker process runs
the items → the last one ends the batch → a light worker process (no GPU work,
queue `light`) builds the archive → its signed link → a zip whose audio decodes."""

from __future__ import annotations

import io
import json
import time
import zipfile
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redis
import soundfile as sf

from tests.e2e.conftest import SYNTHETIC, HttpCaller, WorkerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def light_queue(broker: redis.Redis) -> Iterator[None]:
    broker.delete("light")
    yield
    broker.delete("light")


def _wait_for_archive(http: httpx.Client, batch_id: str, timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    manifest: dict[str, Any] = {}
    while time.monotonic() < deadline:
        manifest = http.get(f"/v1/batches/{batch_id}").json()
        if manifest["archive"]["status"] in ("ready", "failed"):
            return manifest
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} not archived: {manifest}")


def test_a_batch_runs_on_a_synthesis_worker_and_is_archived_by_a_light_worker(
    start_worker: Callable[..., WorkerProcess],
    http_caller: Callable[[str], HttpCaller],
    light_queue: None,
) -> None:
    synth = start_worker()
    light = start_worker(queues="light")
    alice = http_caller("alice")
    bob = http_caller("bob")
    texts = ["The first line.", "A second, longer line of the batch.", "Third."]
    items = [{"text": t, "custom_id": f"line-{n}"} for n, t in enumerate(texts)]

    created = alice.http.post("/v1/batches", json={"items": items})

    assert created.status_code == 202, created.text
    batch_id = created.json()["id"]
    manifest = _wait_for_archive(alice.http, batch_id)
    assert manifest["status"] == "completed", manifest
    assert manifest["counts"]["succeeded"] == 3
    assert manifest["archive"]["status"] == "ready", manifest
    assert bob.http.get(f"/v1/batches/{batch_id}").status_code == 404

    # No API key: the signed link alone is enough.
    downloaded = httpx.get(manifest["archive"]["url"], timeout=30)
    assert downloaded.status_code == 200
    assert len(downloaded.content) == manifest["archive"]["bytes"]
    archive = zipfile.ZipFile(io.BytesIO(downloaded.content))
    assert archive.testzip() is None
    names = [f"{n:05d}-line-{n}.wav" for n in range(3)]
    assert archive.namelist() == [*names, "manifest.json", "manifest.csv"]
    rows = json.loads(archive.read("manifest.json"))["items"]
    assert [row["custom_id"] for row in rows] == ["line-0", "line-1", "line-2"]
    assert [row["file"] for row in rows] == names
    for row, text in zip(rows, texts, strict=True):
        info = sf.info(io.BytesIO(archive.read(row["file"])))
        assert info.samplerate == 24000
        assert info.duration == pytest.approx(row["duration_s"], abs=0.002)
        # The synthetic engine speaks a fixed time per character (in whole chunks).
        assert info.duration >= len(text) * SYNTHETIC["seconds_per_char"] * 0.99
    # Each worker did its own part: the items on the synthesis worker, the
    # archive on the light one.
    assert any("synthesis.synthesize_job[" in line for line in synth.lines)
    assert not any("batches.build_archive[" in line for line in synth.lines)
    assert any("batches.build_archive[" in line for line in light.lines)
