"""Fault: the web tier is killed (SIGKILL) while three clients stream.

uvicorn dies without running a line: no relay gets to cancel its job, as it does
when a client goes away. The decided behaviour (README, "Streaming"): the jobs
finish on the worker, are stored and charged once; each client saw a truncated
body, but had `X-Job-Id` and `Location` in the headers sent before the first audio
byte, and once the web tier is up again `GET /v1/speech/{id}` says `succeeded`
with an `audio_url` that downloads the whole file.
"""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import soundfile as sf
from django.utils import timezone

from tenants.models import Plan
from tests.conftest import make_persona
from tests.e2e.asgi import AsgiServer
from tests.e2e.conftest import SYNTHETIC, WorkerProcess
from tests.faults.figures import outcome, wait_until_finished

pytestmark = [pytest.mark.e2e, pytest.mark.embedded, pytest.mark.django_db(transaction=True)]

CLIENTS = 3
BOUND_S = 30.0  # no job may stay unfinished longer than this after the kill
# At rtf 1 the engine makes audio in real time: 3 s of audio is a 3 s stream.
TEXT = "The web tier died, but the worker kept on speaking."
WAV_HEADER = 44


@dataclass
class Listener:
    """One streaming client: what it got before the connection broke."""

    headers: dict[str, str] = field(default_factory=dict)
    status: int = 0
    body: bytes = b""
    error: str = ""
    started: threading.Event = field(default_factory=threading.Event)

    def listen(self, url: str, key: str) -> None:
        try:
            with httpx.stream(
                "POST",
                f"{url}/v1/speech",
                json={"text": TEXT, "stream": True},
                headers={"Authorization": f"Bearer {key}"},
                timeout=30,
            ) as response:
                self.status = response.status_code
                self.headers = dict(response.headers)
                for piece in response.iter_raw():
                    self.body += piece
                    if len(self.body) > WAV_HEADER:
                        self.started.set()
        except httpx.HTTPError as exc:
            self.error = type(exc).__name__
        finally:
            self.started.set()


def test_streams_cut_by_a_killed_web_tier_finish_stored_and_charged_once(
    start_worker: Callable[..., WorkerProcess],
    asgi_server: Callable[..., AsgiServer],
    plan: Plan,
    tmp_path: Any,
) -> None:
    options = {**SYNTHETIC, "rtf": 1.0, "state_dir": str(tmp_path / "gpu")}
    start_worker(
        {"CHORUS_WORKER_STREAMS": str(CLIENTS), "CHORUS_ENGINE_OPTIONS": json.dumps(options)}
    )
    server = asgi_server()
    alice = make_persona("alice", plan)
    listeners = [Listener() for _ in range(CLIENTS)]
    threads = [
        threading.Thread(target=listener.listen, args=(server.url, alice.key), daemon=True)
        for listener in listeners
    ]
    for thread in threads:
        thread.start()
    for listener in listeners:
        assert listener.started.wait(20), "no audio came"
    time.sleep(0.5)  # well into the streams

    server.process.kill()
    server.process.wait()
    killed_at = timezone.now()
    for thread in threads:
        thread.join(10)
    ids = [listener.headers.get("x-job-id", "") for listener in listeners]
    assert all(ids), [listener.headers for listener in listeners]

    server = asgi_server()  # the supervisor starts it again
    wait_until_finished(ids, bound_s=BOUND_S)
    result = outcome(tenant=alice.tenant, job_ids=ids, repaired_at=killed_at)
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {alice.key}"}, timeout=30
    ) as http:
        jobs = [http.get(f"/v1/speech/{job_id}").json() for job_id in ids]
        files = [httpx.get(job["audio_url"], timeout=30) for job in jobs]

    fractions = []
    for listener, file in zip(listeners, files, strict=True):
        assert file.status_code == 200, file.text
        samples, _ = sf.read(io.BytesIO(file.content), dtype="int16")
        streamed = (len(listener.body) - WAV_HEADER) // 2
        fractions.append(streamed / len(samples))
    client_saw = (
        f"200 with X-Job-Id and Location, then a body cut off at "
        f"{min(fractions):.0%}-{max(fractions):.0%} ({listeners[0].error}); after the restart "
        f"GET said succeeded and audio_url downloaded the whole file"
    )
    print("\n" + result.line("web tier killed mid-stream", client_saw))

    assert result.lost == 0, result.statuses
    assert result.double_charged == 0
    assert result.longest_stall_s < BOUND_S
    for listener, job, file, fraction in zip(listeners, jobs, files, fractions, strict=True):
        assert listener.status == 200
        assert listener.headers["location"].endswith(f"/v1/speech/{job['id']}")
        assert listener.error == "RemoteProtocolError"  # a cut transfer, not a short file
        assert 0 < fraction < 1
        assert job["status"] == "succeeded", job
        assert sf.info(io.BytesIO(file.content)).duration == pytest.approx(
            job["duration_s"], abs=0.002
        )  # the whole file, not what the stream had reached
