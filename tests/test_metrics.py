"""/metrics: protected by a token, parsed by Prometheus's own parser, and fed by
the services where things happen (the e2e test counts real workers' jobs)."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from chorus.errors import StorageError
from synthesis.models import WorkerHeartbeat
from tests.conftest import Persona
from tests.unreachable import unreachable_broker  # noqa: F401  (a fixture)

TOKEN = "metrics-test-token"


@pytest.fixture
def token(settings: Any) -> str:
    settings.METRICS_TOKEN = TOKEN
    return TOKEN


def scrape(client: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    return samples(response.content.decode())


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(scraped: dict[Any, float], name: str, **labels: str) -> float:
    return scraped.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_do_not_exist_without_a_configured_token(client: Any, settings: Any) -> None:
    settings.METRICS_TOKEN = None
    assert client.get("/metrics").status_code == 404


@pytest.mark.django_db
@pytest.mark.parametrize("header", ["", "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x"])
def test_metrics_refuse_a_missing_or_wrong_token(client: Any, token: str, header: str) -> None:
    response = client.get("/metrics", HTTP_AUTHORIZATION=header)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.django_db(transaction=True)  # published on commit: the queue holds it
def test_it_counts_admitted_and_refused_submissions_by_code(
    client: Any, token: str, alice: Persona, broker: Any
) -> None:
    before = scrape(client)

    assert alice.client.post("/v1/speech", {"text": "Hi."}, format="json").status_code == 202
    refused = alice.client.post("/v1/speech", {"text": "Hi.", "fromat": "mp3"}, format="json")
    assert refused.status_code == 400

    after = scrape(client)
    admitted = "chorus_jobs_admitted_total"
    assert (
        value(after, admitted, priority="normal") == value(before, admitted, priority="normal") + 1
    )
    refusals = "chorus_jobs_refused_total"
    assert value(after, refusals, code="unknown_field") == (
        value(before, refusals, code="unknown_field") + 1
    )
    requests = "chorus_http_requests_total"
    labels = {"route": "speech-list", "method": "POST", "status": "202"}
    assert value(after, requests, **labels) == value(before, requests, **labels) + 1
    assert value(after, "chorus_http_request_duration_seconds_count", **labels) == (
        value(before, "chorus_http_request_duration_seconds_count", **labels) + 1
    )
    assert value(after, "chorus_queue_depth", priority="normal") == 1
    assert value(after, "chorus_jobs_in_flight", priority="normal", status="queued") == 1
    assert value(after, "chorus_broker_up") == 1
    assert value(after, "chorus_database_up") == 1


@pytest.mark.django_db
def test_unknown_paths_count_as_one_route_not_one_per_path(client: Any, token: str) -> None:
    client.get("/no/such/thing/1")
    client.get("/no/such/thing/2")
    scraped = scrape(client)
    routes = {
        dict(labels).get("route") for name, labels in scraped if name.startswith("chorus_http")
    }
    assert "unmatched" in routes
    assert not any(route and "/" in route for route in routes)


@pytest.mark.django_db
def test_worker_gauges_come_from_fresh_heartbeats(client: Any, token: str) -> None:
    from django.utils import timezone

    now = timezone.now()
    WorkerHeartbeat.objects.create(
        name="gpu-1:42",
        engine="cosyvoice2",
        device="cuda:0",
        memory_bytes=3 * 2**30,
        slots=7,
        slots_busy=3,
        started_at=now,
        seen_at=now,
    )
    WorkerHeartbeat.objects.create(
        name="gpu-2:43",
        engine="cosyvoice2",
        device="cuda:0",
        slots=7,
        slots_busy=2,
        started_at=now,
        seen_at=now - timezone.timedelta(seconds=60),
    )
    scraped = scrape(client)
    assert value(scraped, "chorus_worker_up", worker="gpu-1:42") == 1
    assert value(scraped, "chorus_worker_streams_running", worker="gpu-1:42") == 3
    assert value(scraped, "chorus_worker_streams_capacity", worker="gpu-1:42") == 7
    assert value(scraped, "chorus_worker_engine_memory_bytes", worker="gpu-1:42") == 3 * 2**30
    assert (
        value(
            scraped, "chorus_worker_info", worker="gpu-1:42", engine="cosyvoice2", device="cuda:0"
        )
        == 1
    )
    # Silent for a minute: gone, and running nothing as far as anyone knows.
    assert value(scraped, "chorus_worker_up", worker="gpu-2:43") == 0
    assert value(scraped, "chorus_worker_streams_running", worker="gpu-2:43") == 0
    assert value(scraped, "chorus_worker_heartbeat_age_seconds", worker="gpu-2:43") >= 59


@pytest.mark.django_db
def test_storage_errors_and_sweeps_are_counted(client: Any, token: str) -> None:
    from synthesis.services.sweeper import sweep

    before = scrape(client)
    StorageError("The bucket is unreachable.", details={"operation": "put"})
    sweep()
    after = scrape(client)
    name = "chorus_storage_errors_total"
    assert value(after, name, operation="put") == value(before, name, operation="put") + 1
    assert value(after, "chorus_sweeps_total") == value(before, "chorus_sweeps_total") + 1


@pytest.mark.django_db
@pytest.mark.usefixtures("unreachable_broker")
def test_a_scrape_with_the_broker_down_still_answers(client: Any, token: str) -> None:
    scraped = scrape(client)
    assert value(scraped, "chorus_broker_up") == 0
    assert value(scraped, "chorus_database_up") == 1


def test_the_counts_of_exited_processes_are_folded_into_one_archive(
    tmp_path: Any, settings: Any
) -> None:
    """Processes that count and exit one after another: each one that starts
    folds its exited predecessors' files into one archive per type, and a scrape
    still adds up to every count."""
    import subprocess
    import sys

    folder = tmp_path / "metrics"
    count = (
        "import django; django.setup(); from chorus import metrics; "
        "metrics.observe_job_refused(code='rate_limited'); "
        "metrics.observe_first_audio(priority='high', seconds=0.3)"
    )
    env = {**__import__("os").environ, "PROMETHEUS_MULTIPROC_DIR": str(folder)}
    for _ in range(3):
        subprocess.run([sys.executable, "-c", count], env=env, check=True, cwd=settings.BASE_DIR)

    report = (
        "import django; django.setup(); from chorus import metrics; "
        "from prometheus_client import CollectorRegistry, generate_latest; "
        "from prometheus_client.multiprocess import MultiProcessCollector; "
        "r = CollectorRegistry(); MultiProcessCollector(r, path=str(metrics.METRICS_DIR)); "
        "print(generate_latest(r).decode())"
    )
    out = subprocess.run(
        [sys.executable, "-c", report],
        env=env,
        check=True,
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
    ).stdout

    after = sorted(path.name for path in folder.glob("*.db"))
    # The archive and the reporting process's own file, however many came before.
    assert len([name for name in after if name.startswith("counter_")]) == 2
    assert any(name.endswith("-archive.db") for name in after)
    scraped = samples(out)
    assert value(scraped, "chorus_jobs_refused_total", code="rate_limited") == 3
    assert value(scraped, "chorus_job_first_audio_seconds_count", priority="high") == 3
    assert value(scraped, "chorus_job_first_audio_seconds_sum", priority="high") == pytest.approx(
        0.9
    )
    assert value(scraped, "chorus_job_first_audio_seconds_bucket", priority="high", le="0.5") == 3
    assert value(scraped, "chorus_job_first_audio_seconds_bucket", priority="high", le="0.25") == 0


def _exited_pid() -> int:
    import subprocess

    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


@pytest.mark.django_db
def test_an_empty_file_of_a_live_process_does_not_fail_a_scrape(client: Any, token: str) -> None:
    """prometheus-client creates a process's file empty and sizes it after: a
    scrape that comes in between (or after a SIGKILL in between) finds an empty
    file, which it cannot read. The scrape passes over it."""
    from chorus import metrics

    # The parent of the test run is alive, so no compaction takes its file away.
    empty = metrics.METRICS_DIR / f"counter_{metrics._HOST}-{__import__('os').getppid()}.db"
    assert not empty.exists()
    empty.touch()
    try:
        metrics.observe_job_refused(code="rate_limited")
        assert value(scrape(client), "chorus_jobs_refused_total", code="rate_limited") >= 1
    finally:
        empty.unlink()


def test_a_process_starts_after_one_was_killed_while_creating_its_files(
    tmp_path: Any, settings: Any
) -> None:
    """A worker SIGKILLed while it created its metrics files leaves them empty;
    the next process that starts folds the other exited processes' counts and
    drops the empty files instead of failing to start."""
    import os
    import subprocess
    import sys

    from chorus import metrics

    folder = tmp_path / "metrics"
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(folder)}
    count = (
        "import django; django.setup(); from chorus import metrics; "
        "metrics.observe_job_refused(code='rate_limited')"
    )
    subprocess.run([sys.executable, "-c", count], env=env, check=True, cwd=settings.BASE_DIR)
    killed = _exited_pid()
    empty = [folder / f"{kind}_{metrics._HOST}-{killed}.db" for kind in ("counter", "histogram")]
    for path in empty:
        path.touch()

    report = (
        "import django; django.setup(); from chorus import metrics; "
        "from prometheus_client import CollectorRegistry, generate_latest; "
        "r = CollectorRegistry(); metrics.ProcessFilesCollector(r); "
        "print(generate_latest(r).decode())"
    )
    done = subprocess.run(
        [sys.executable, "-c", report],
        env=env,
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
    )

    assert done.returncode == 0, done.stderr
    assert not any(path.exists() for path in empty)
    assert value(samples(done.stdout), "chorus_jobs_refused_total", code="rate_limited") == 1
