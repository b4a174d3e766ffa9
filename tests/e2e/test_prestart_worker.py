"""A real worker process starts a streamed job's engine from its first message's
header, while the claim is on its way (`synthesis.prestart`): uvicorn, the
broker, a Celery worker, the synthetic engine."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tenants.models import Plan
from tests.conftest import make_persona
from tests.e2e.asgi import AsgiServer, asgi_server  # noqa: F401  (a fixture)
from tests.e2e.conftest import SYNTHETIC, WorkerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.embedded, pytest.mark.django_db(transaction=True)]

EARLY = "(engine started while the claim was on its way)"


def finished_line(worker: WorkerProcess, job_id: str, timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in list(worker.lines):
            if job_id in line and "s of audio" in line:
                return line
        time.sleep(0.05)
    raise AssertionError("no end line for the job:\n" + "".join(worker.lines[-40:]))


def test_a_streamed_job_starts_its_engine_while_its_claim_is_on_the_way(
    start_worker: Callable[..., WorkerProcess],
    asgi_server: Callable[..., AsgiServer],  # noqa: F811
    plan: Plan,
    tmp_path: Any,
) -> None:
    worker = start_worker(
        env={"CHORUS_ENGINE_OPTIONS": json.dumps({**SYNTHETIC, "state_dir": str(tmp_path)})}
    )
    server = asgi_server()
    alice = make_persona("alice", plan)
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {alice.key}"}, timeout=30
    ) as http:
        with http.stream(
            "POST", "/v1/speech", json={"text": "Started early.", "stream": True}
        ) as response:
            assert response.status_code == 200, response.read()
            job_id = response.headers["X-Job-Id"]
            body = response.read()
        assert len(body) > 44  # a WAV header and samples

        assert EARLY in finished_line(worker, job_id)
