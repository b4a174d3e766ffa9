"""A worker's drain on SIGTERM (`synthesis.drain`), without a Celery process
around it; `tests/e2e/test_worker_drain.py` sends the real signal."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from synthesis import drain
from synthesis.engines.base import EngineInfo
from synthesis.heartbeat import Heartbeat
from synthesis.models import Job, JobStatus, WorkerHeartbeat
from synthesis.services.execution import job_claim
from synthesis.services.jobs import job_create
from synthesis.speech_request import SpeechRequest
from synthesis.tasks import synthesize_job_task
from tests.conftest import Persona

# The drain works on a thread of its own, with its own database connection.
pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "gpu-1:7"


@pytest.fixture
def heartbeat(monkeypatch: Any) -> Iterator[Heartbeat]:
    """This process as a GPU worker that has not been told to stop yet."""
    monkeypatch.setattr(drain, "_draining", threading.Event())
    monkeypatch.setattr(drain, "_current", None)
    info = EngineInfo(name="synthetic", sample_rate=24000, device="emu0", memory_bytes=0)
    beat = Heartbeat(name=WORKER, info=info, slots=3)
    beat.beat()
    yield beat
    for thread in threading.enumerate():
        if thread.name == "drain":
            thread.join(timeout=30)


def wait_for(condition: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_job_taken_while_draining_is_sent_again_at_once_unclaimed(
    alice: Persona, broker: Any, heartbeat: Heartbeat
) -> None:
    job = job_create(
        tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="Not here, not now.")
    )
    stale = job_create(
        tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="Sent twice.")
    )
    Job.objects.filter(pk=stale.pk).update(epoch=2)  # a newer message is in line
    broker.delete("synth.normal")

    drain.drain_start(worker=WORKER, heartbeat=heartbeat, drain_s=60)

    assert synthesize_job_task(str(job.pk), job.epoch)["status"] == "sent_back"
    assert synthesize_job_task(str(stale.pk), 1)["status"] == "skipped"
    # Not claimed; in line again under a new epoch, the taken message now stale.
    assert Job.objects.values_list("status", "attempts", "epoch").get(pk=job.pk) == (
        JobStatus.QUEUED,
        0,
        2,
    )
    assert Job.objects.values_list("epoch", flat=True).get(pk=stale.pk) == 2
    assert broker.llen("synth.normal") == 1
    wait_for(lambda: WorkerHeartbeat.objects.get(name=WORKER).draining_since is not None)


def test_at_its_deadline_the_drain_hands_back_what_still_runs(
    alice: Persona, broker: Any, heartbeat: Heartbeat, monkeypatch: Any, caplog: Any
) -> None:
    monkeypatch.setattr(drain, "HAND_BACK_WAIT_S", 30.0)  # never leave this test process
    job = job_create(
        tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="Too long to finish.")
    )
    assert job_claim(job_id=job.pk, worker=WORKER, epoch=job.epoch) is not None
    heartbeat.busy = 1  # its attempt runs on

    with caplog.at_level(logging.INFO, logger="synthesis.drain"):
        drain.drain_start(worker=WORKER, heartbeat=heartbeat, drain_s=0.3)
        wait_for(lambda: Job.objects.get(pk=job.pk).status == JobStatus.QUEUED)
        heartbeat.busy = 0  # the superseded attempt stopped at its next chunk
        wait_for(lambda: not any(t.name == "drain" for t in threading.enumerate()))
        drain.drain_report()

    assert Job.objects.values_list("epoch", "attempts").get(pk=job.pk) == (2, 1)
    assert "draining: taking no new jobs; 1 running get 0.3 s to finish" in caplog.text
    assert "0 jobs finished, 1 handed back, 0 failed" in caplog.text
