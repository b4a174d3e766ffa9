"""A waiting job's estimated start counts only the streams its priority may use.

A worker runs up to `high` streams, but starts a `normal` job only while fewer
than its `normal` limit run and a `low` job below its `low` limit: a `low` line
drains at the `low` limit's pace, not the card's whole capacity.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from synthesis.engines.base import EngineInfo
from synthesis.heartbeat import Heartbeat
from synthesis.models import Job, JobStatus, WorkerHeartbeat
from synthesis.services.jobs import job_create
from synthesis.speech_request import SpeechRequest
from synthesis.stream_limits import StreamLimits
from tests.conftest import Persona

pytestmark = pytest.mark.django_db

SERVICE_S = 4.0  # every recent job took this long


def a_t4_worker(queues: tuple[str, ...] = ("synth.high", "synth.normal", "synth.low")) -> None:
    info = EngineInfo(name="synthetic", sample_rate=24000, device="t4-0", memory_bytes=0)
    limits = StreamLimits(low=2, normal=5, high=7)
    Heartbeat(
        name=f"host:{len(queues)}",
        info=info,
        slots=7,
        limits=limits,
        node="gpu0@host",
        queues=queues,
    ).beat()


def recent_history(persona: Persona) -> None:
    now = timezone.now()
    for n in range(10):
        job = job_create(
            tenant=persona.tenant, api_key=persona.api_key, speech=SpeechRequest(text=f"Done {n}.")
        )
        Job.objects.filter(pk=job.pk).update(
            status=JobStatus.SUCCEEDED,
            started_at=now - timedelta(seconds=SERVICE_S + n),
            finished_at=now - timedelta(seconds=n),
        )


def wait_of(persona: Persona, job: Job) -> float:
    body = persona.client.get(f"/v1/speech/{job.pk}").json()
    start = datetime.fromisoformat(body["queue"]["estimated_start_at"])
    return (start - timezone.now()).total_seconds()


def test_a_low_line_drains_at_the_low_limits_pace(alice: Persona, broker: Any) -> None:
    a_t4_worker()
    recent_history(alice)

    def submit(priority: str) -> Job:
        return job_create(
            tenant=alice.tenant,
            api_key=alice.api_key,
            speech=SpeechRequest(text="Waiting."),
            priority=priority,
        )

    normals = [submit("normal") for _ in range(4)]
    lows = [submit("low") for _ in range(4)]

    # The 4th normal job: 3 ahead, on 5 streams. The 4th low: 4 + 3 ahead, on 2.
    assert wait_of(alice, normals[-1]) == pytest.approx(3 / 5 * SERVICE_S, abs=0.5)
    assert wait_of(alice, lows[-1]) == pytest.approx(7 / 2 * SERVICE_S, abs=0.5)


def test_a_worker_that_does_not_take_a_queue_does_not_count_for_it(
    alice: Persona, broker: Any
) -> None:
    a_t4_worker()
    a_t4_worker(queues=("synth.high",))  # a dedicated realtime lane
    recent_history(alice)
    normals = [
        job_create(
            tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="Waiting.")
        )
        for _ in range(6)
    ]

    assert wait_of(alice, normals[-1]) == pytest.approx(5 / 5 * SERVICE_S, abs=0.5)


def test_a_draining_worker_does_not_count(alice: Persona, broker: Any) -> None:
    a_t4_worker()
    a_t4_worker(queues=("synth.normal", "synth.low"))  # a second card, 5 normal streams
    recent_history(alice)
    normals = [
        job_create(
            tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="Waiting.")
        )
        for _ in range(6)
    ]
    assert wait_of(alice, normals[-1]) == pytest.approx(5 / 10 * SERVICE_S, abs=0.5)

    WorkerHeartbeat.objects.filter(name="host:2").update(draining_since=timezone.now())

    assert wait_of(alice, normals[-1]) == pytest.approx(5 / 5 * SERVICE_S, abs=0.5)


def test_the_heartbeat_reports_its_node_queues_limits_and_memory() -> None:
    a_t4_worker()

    row = WorkerHeartbeat.objects.get()
    assert (row.node, row.queues) == ("gpu0@host", "synth.high,synth.normal,synth.low")
    assert (row.slots, row.streams_normal, row.streams_low) == (7, 5, 2)
    assert row.rss_bytes > 10 * 2**20  # this process's own, even with an engine that reports 0
