"""The load-test command against a live server and a real synthetic worker."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from tests.e2e.conftest import HttpCaller, WorkerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.embedded, pytest.mark.timeout(120)]


def test_a_short_run_measures_every_level_and_writes_its_files(
    start_worker: Callable[..., WorkerProcess],
    http_caller: Callable[[str], HttpCaller],
    tmp_path: Path,
) -> None:
    worker = start_worker()
    caller = http_caller("alice")
    stdout, stderr = io.StringIO(), io.StringIO()

    call_command(
        "loadtest",
        "--url", str(caller.http.base_url),
        "--key", caller.persona.key,
        "--concurrency", "1,2",
        "--repetitions", "2",
        "--warmup", "1",
        "--priority", "high:1,normal:1",
        "--worker-pid", str(worker.process.pid),
        "--output", str(tmp_path),
        stdout=stdout,
        stderr=stderr,
    )  # fmt: skip

    text = stdout.getvalue()
    assert "Engine reported by the jobs: synthetic" in text
    assert "concurrency 1: 2 requests, 0 failed" in text
    assert "concurrency 2: 2 requests, 0 failed" in text
    assert "level 2/2 (concurrency 2)" in stderr.getvalue()
    levels = list(csv.DictReader((tmp_path / "loadtest.csv").open()))
    assert [row["concurrency"] for row in levels] == ["1", "2"]
    for row in levels:
        # The worker's first chunk takes at least its 0.05 s delay; the whole job longer.
        assert 0.05 < float(row["first_audio_p50_s"]) < float(row["total_p50_s"]) < 30
        assert float(row["jobs_per_s"]) > 0
        assert float(row["worker_rss_peak_mib"]) > 0
    samples = list(csv.DictReader((tmp_path / "samples.csv").open()))
    assert len(samples) == 4
    assert {s["priority"] for s in samples} == {"high", "normal"}
    assert all(s["ok"] == "True" and s["audio_s"] == "4.000" for s in samples)
    assert (tmp_path / "loadtest.png").stat().st_size > 0
    assert "| 2 | 2 | 0 (0 %) |" in (tmp_path / "loadtest.md").read_text()


def test_a_stream_run_falls_back_to_polling_where_the_server_does_not_stream(
    start_worker: Callable[..., WorkerProcess],
    http_caller: Callable[[str], HttpCaller],
    tmp_path: Path,
) -> None:
    start_worker()
    caller = http_caller("alice")
    stdout = io.StringIO()

    call_command(
        "loadtest",
        "--url", str(caller.http.base_url),
        "--key", caller.persona.key,
        "--concurrency", "1",
        "--repetitions", "1",
        "--warmup", "0",
        "--stream",
        "--quiet",
        "--output", str(tmp_path),
        stdout=stdout,
    )  # fmt: skip

    text = stdout.getvalue()
    assert "concurrency 1: 1 requests, 0 failed" in text
    [sample] = list(csv.DictReader((tmp_path / "samples.csv").open()))
    # Either the server streamed the audio, or the run says it polled instead.
    assert sample["streamed"] == "True" or "were measured by polling" in text


def test_a_wrong_key_stops_the_run_after_the_warm_up(
    http_caller: Callable[[str], HttpCaller],
) -> None:
    caller = http_caller("alice")
    with pytest.raises(CommandError, match="every warm-up request failed"):
        call_command(
            "loadtest", "--url", str(caller.http.base_url), "--key", "ck_wrong", "--quiet",
            stdout=io.StringIO(),
        )  # fmt: skip
