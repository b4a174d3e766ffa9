"""Webhooks delivered by a real webhook worker process (a light worker on the
`webhooks` queue), over Redis, to a real HTTP
receiver on loopback (allowed by the operator's setting, as the SSRF guard
refuses loopback otherwise)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from django.conf import settings as django_settings
from standardwebhooks import Webhook

from synthesis.models import WorkerHeartbeat
from synthesis.worker import light_worker_argv
from tests.e2e.conftest import ROOT, WorkerProcess, collect_lines, stack_env, wait_for_job
from tests.webhooks.receiver import Receiver, receiver_running
from webhooks.events import event_publish
from webhooks.models import WebhookDelivery
from webhooks.services.endpoints import endpoint_create

pytestmark = [pytest.mark.e2e, pytest.mark.embedded, pytest.mark.django_db(transaction=True)]

RECEIVER_NETWORK = "127.0.0.1/32"


@pytest.fixture
def receiver(settings: Any) -> Iterator[Receiver]:
    settings.WEBHOOK_ALLOWED_NETWORKS = [RECEIVER_NETWORK]
    with receiver_running() as running:
        yield running


@pytest.fixture
def start_light_worker(
    transactional_db: None, tmp_path: Path
) -> Iterator[Callable[..., WorkerProcess]]:
    client = redis.Redis.from_url(django_settings.REDIS_URL or "")
    client.delete(django_settings.WEBHOOK_QUEUE)
    workers: list[WorkerProcess] = []

    def start(env: dict[str, str] | None = None) -> WorkerProcess:
        process = subprocess.Popen(
            light_worker_argv(
                queue=django_settings.WEBHOOK_QUEUE, hostname=f"webhooks{len(workers)}@%h"
            ),
            cwd=ROOT,
            env=stack_env(
                {
                    "CHORUS_WEBHOOK_ALLOWED_NETWORKS": RECEIVER_NETWORK,
                    "CHORUS_WEBHOOK_RETRY_SCHEDULE": "0.3,0.3,0.3",
                    **(env or {}),
                }
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        worker = WorkerProcess(process)
        threading.Thread(target=collect_lines, args=(process, worker.lines), daemon=True).start()
        workers.append(worker)
        worker.wait_ready()
        return worker

    yield start
    for worker in workers:
        worker.stop()
    client.delete(django_settings.WEBHOOK_QUEUE)
    client.close()


def test_a_light_worker_loads_no_engine_and_delivers_with_retries(
    alice: Any, receiver: Receiver, start_light_worker: Callable[..., WorkerProcess]
) -> None:
    # An engine that cannot load here (no model): a worker that tried would stop.
    worker = start_light_worker(
        {"CHORUS_ENGINE": "cosyvoice2", "COSYVOICE_MODEL_DIR": "/nonexistent/model"}
    )
    endpoint = endpoint_create(tenant=alice.tenant, url=receiver.url)
    receiver.statuses = [500, 500]
    event = event_publish(tenant_id=alice.tenant.pk, event_type="batch.completed", data={"n": 7})
    assert event is not None

    requests = receiver.wait_for(3)
    assert {r.headers["webhook-id"] for r in requests} == {event.webhook_id}
    for request in requests:
        assert Webhook(endpoint.secret).verify(request.body, request.headers)["data"] == {"n": 7}
    delivery = WebhookDelivery.objects.get()
    for _ in range(50):
        delivery.refresh_from_db()
        if delivery.status != "pending":
            break
        threading.Event().wait(0.1)
    assert (delivery.status, delivery.attempts) == ("succeeded", 3)
    assert worker.process.poll() is None
    assert any("light worker on webhooks: no engine loaded" in line for line in worker.lines)
    assert not any("engine" in line and "loaded on" in line for line in worker.lines)
    assert not WorkerHeartbeat.objects.exists()  # not synthesis capacity


def test_a_finished_job_reaches_the_receiver_with_a_link_that_downloads(
    live_server: Any,
    http_caller: Callable[[str], Any],
    receiver: Receiver,
    start_worker: Callable[..., WorkerProcess],
    start_light_worker: Callable[..., WorkerProcess],
) -> None:
    start_worker()
    # Links the light worker signs point at this test's web server.
    start_light_worker({"CHORUS_PUBLIC_URL": live_server.url})
    caller = http_caller("carol")
    created = caller.http.post(
        "/v1/webhooks/endpoints", json={"url": receiver.url, "event_types": ["speech.succeeded"]}
    )
    assert created.status_code == 201, created.text
    secret = created.json()["secret"]
    job = caller.http.post("/v1/speech", json={"text": "Hello from the pipeline."}).json()
    assert wait_for_job(caller.http, job["id"])["status"] == "succeeded"

    [request] = receiver.wait_for(1)
    payload = Webhook(secret).verify(request.body, request.headers)
    assert payload["type"] == "speech.succeeded"
    assert payload["data"]["id"] == job["id"]
    audio = httpx.get(payload["data"]["audio_url"], timeout=10)
    assert audio.status_code == 200
    assert audio.content[:4] == b"RIFF"
    assert len(audio.content) > 1_000


def test_runstack_delivers_webhooks_with_its_own_webhook_worker(
    alice: Any, receiver: Receiver, broker: Any, tmp_path: Path
) -> None:
    """What `make run` starts: a job's ending reaches the receiver with no other process."""
    from tests.e2e.asgi import free_port
    from tests.e2e.conftest import stop_process

    port = free_port()
    env = stack_env(
        {
            "CHORUS_ENGINE": "synthetic",
            "CHORUS_ENGINE_OPTIONS": '{"first_chunk_delay_s": 0, "rtf": 0.01}',
            "CHORUS_DATA_DIR": str(tmp_path / "var"),
            "CHORUS_WEBHOOK_ALLOWED_NETWORKS": RECEIVER_NETWORK,
            "PYTHONUNBUFFERED": "1",
        }
    )
    process = subprocess.Popen(
        # --verbose: the workers' own lines in its output, where this test reads them.
        [sys.executable, "manage.py", "runstack", "--verbose", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    threading.Thread(target=collect_lines, args=(process, lines), daemon=True).start()
    try:
        deadline = time.monotonic() + 90
        while "Press Ctrl-C to stop." not in "".join(lines):
            assert process.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.1)
        endpoint = endpoint_create(tenant=alice.tenant, url=receiver.url)
        job = alice.client.post("/v1/speech", {"text": "Hello."}, format="json").json()
        [request] = receiver.wait_for(1, timeout=60)
        payload = Webhook(endpoint.secret).verify(request.body, request.headers)
        assert (payload["type"], payload["data"]["id"]) == ("speech.succeeded", job["id"])
        # Deliveries and long texts each have a worker (and threads) of their own.
        assert any("light worker on webhooks: no engine loaded" in line for line in lines)
        assert any("light worker on light: no engine loaded" in line for line in lines)
    finally:
        stop_process(process)
