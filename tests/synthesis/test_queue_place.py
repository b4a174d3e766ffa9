"""A waiting job's place in line against the order jobs actually start in.

Several tenants submit jobs of every priority under fair admission with the
production default of two broker slots per tenant, so most jobs wait `pending`.
The broker is a recorder with one FIFO list per queue; a worker takes the first
non-empty queue in priority order, as `-Q synth.high,synth.normal,synth.low`
does, and runs the job through the real claim (which releases the tenant's next
pending job). Every place the API reports must equal the number of jobs that
really start before that job.
"""

from __future__ import annotations

import random
import uuid
from collections import deque
from typing import Any

import pytest

from synthesis.engines.base import Engine
from synthesis.models import WAITING, Job
from synthesis.services.execution import job_execute
from synthesis.services.jobs import job_cancel, job_create
from synthesis.services.sweeper import sweep
from synthesis.speech_request import SpeechRequest
from tests.conftest import Persona, make_persona

pytestmark = pytest.mark.django_db(transaction=True)

QUEUES = ("synth.high", "synth.normal", "synth.low")


class Broker:
    def __init__(self) -> None:
        self.queues: dict[str, deque[tuple[str, int]]] = {q: deque() for q in QUEUES}

    def publish(self, _: Any, *, args: Any, queue: str, **__: Any) -> None:
        self.queues[queue].append((args[0], args[1]))

    def next_message(self) -> tuple[str, int] | None:
        for queue in QUEUES:
            if self.queues[queue]:
                return self.queues[queue].popleft()
        return None


@pytest.fixture
def broker_lists(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Broker:
    settings.TENANT_BROKER_SLOTS = 2  # the production default
    broker = Broker()
    monkeypatch.setattr("synthesis.tasks.publish_task", broker.publish)
    return broker


def positions(personas: dict[int, Persona]) -> dict[uuid.UUID, int]:
    """Every waiting job's place, as its owner reads it from the API."""
    places = {}
    for job in Job.objects.filter(status__in=WAITING):
        body = personas[job.tenant_id].client.get(f"/v1/speech/{job.pk}").json()
        places[job.pk] = body["queue"]["position"]
    return places


def work(broker: Broker, engine: Engine, *, jobs: int | None = None) -> list[uuid.UUID]:
    """Run jobs one at a time in broker order; the ids of those that started."""
    started: list[uuid.UUID] = []
    while jobs is None or len(started) < jobs:
        message = broker.next_message()
        if message is None:
            break
        job_id, epoch = message
        result = job_execute(job_id=job_id, engine=engine, worker="w1", epoch=epoch)
        if result["status"] != "skipped":
            started.append(uuid.UUID(job_id))
    return started


@pytest.mark.parametrize("seed", [11, 12, 13, 14])
def test_places_in_line_are_the_order_jobs_start_in(
    plan: Any, broker_lists: Broker, engine: Engine, seed: int
) -> None:
    rng = random.Random(seed)
    team = [make_persona(name, plan) for name in ("alice", "bob", "carol", "dave")]
    personas = {p.tenant.pk: p for p in team}
    for _ in range(40):
        persona = rng.choice(team)
        priority = rng.choice(["high", "normal", "normal", "low", "low", "low"])
        job_create(
            tenant=persona.tenant,
            api_key=persona.api_key,
            speech=SpeechRequest(text="In line."),
            priority=priority,
        )
    assert Job.objects.filter(status="pending").count() > 10

    checkpoints = 0
    while Job.objects.filter(status__in=WAITING).exists():
        places = positions(personas)
        step = rng.randint(1, 8)
        started = work(broker_lists, engine, jobs=step)
        # The jobs that started now are the ones that were told 0, 1, 2, ...
        told = sorted(places, key=places.__getitem__)
        assert [places[job_id] for job_id in told] == list(range(len(told)))
        assert started == told[: len(started)]
        checkpoints += 1
    assert checkpoints > 3


def test_a_tenant_with_an_empty_backlog_is_not_behind_anothers_pending_jobs(
    alice: Persona, bob: Persona, broker_lists: Broker, engine: Engine
) -> None:
    for _ in range(30):
        job_create(
            tenant=alice.tenant,
            api_key=alice.api_key,
            speech=SpeechRequest(text="Bulk."),
            priority="normal",
        )
    bobs = job_create(
        tenant=bob.tenant,
        api_key=bob.api_key,
        speech=SpeechRequest(text="Mine."),
        priority="normal",
    )

    place = bob.client.get(f"/v1/speech/{bobs.pk}").json()["queue"]["position"]

    # Behind alice's two jobs in the broker, not her 28 pending ones.
    assert place == 2
    assert work(broker_lists, engine, jobs=3)[2] == bobs.pk


def test_places_hold_after_cancels_and_a_sweep(
    alice: Persona, bob: Persona, broker_lists: Broker, engine: Engine
) -> None:
    jobs = [
        job_create(
            tenant=who.tenant,
            api_key=who.api_key,
            speech=SpeechRequest(text="x"),
            priority=priority,
        )
        for who, priority in [(alice, "low")] * 5 + [(bob, "low")] * 3 + [(bob, "high")] * 3
    ]
    job_cancel(tenant=alice.tenant, job=jobs[0])
    job_cancel(tenant=bob.tenant, job=jobs[9])
    sweep()
    personas = {p.tenant.pk: p for p in (alice, bob)}

    places = positions(personas)
    started = work(broker_lists, engine)

    assert started == sorted(places, key=places.__getitem__)
    assert sorted(places.values()) == list(range(len(started)))
