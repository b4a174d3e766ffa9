"""The place in line the API reports against the order a real worker starts jobs in.

Four tenants submit a mix of priorities under fair admission with the production
default of two broker slots per tenant (most jobs wait `pending`), while no worker
runs. Each job's place is read from `GET /v1/speech/{id}` and from the list. Then
one real worker process running one stream at a time works the line off, and the
order it really started the jobs in is read from their `started_at`.

The contract, with no job submitted, cancelled or aged meanwhile:
- a job's place is the number of jobs that start before it, exactly (so the
  places are 0, 1, 2, ... and jobs start in place order, `high` before `normal`
  before `low`);
- the detail and the list report the same place;
- while the line is worked off, a job's place never rises, and falls by one for
  each job that starts ahead of it.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from synthesis.models import WAITING, Job, JobStatus
from tests.conftest import Persona, make_persona
from tests.e2e.conftest import WorkerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def places_from_details(team: list[Persona]) -> dict[uuid.UUID, int]:
    places = {}
    for persona in team:
        for job in Job.objects.filter(tenant=persona.tenant, status__in=WAITING):
            body = persona.client.get(f"/v1/speech/{job.pk}").json()
            if body["status"] in ("pending", "queued"):
                places[job.pk] = body["queue"]["position"]
    return places


def places_from_lists(team: list[Persona]) -> dict[uuid.UUID, int]:
    places = {}
    for persona in team:
        for body in persona.client.get("/v1/speech", {"limit": 100}).json()["results"]:
            if body["queue"] is not None:
                places[uuid.UUID(body["id"])] = body["queue"]["position"]
    return places


def test_jobs_start_in_the_order_of_their_places_in_line(
    plan: Any, start_worker: Callable[..., WorkerProcess]
) -> None:
    rng = random.Random(7)
    team = [make_persona(name, plan) for name in ("alice", "bob", "carol", "dave")]
    for n in range(24):
        persona = rng.choice(team)
        priority = rng.choice(["high", "normal", "normal", "low", "low"])
        answer = persona.client.post(
            "/v1/speech", {"text": f"Job {n}.", "priority": priority}, format="json"
        )
        assert answer.status_code == 202, answer.content
    assert Job.objects.filter(status=JobStatus.PENDING).count() >= 6  # fair admission held some

    told = places_from_details(team)
    assert places_from_lists(team) == told
    assert sorted(told.values()) == list(range(24))

    start_worker(env={"CHORUS_WORKER_STREAMS": "1"})
    seen: dict[uuid.UUID, list[int]] = {job_id: [place] for job_id, place in told.items()}
    deadline = time.monotonic() + 120
    while Job.objects.filter(status__in=WAITING).exists():
        assert time.monotonic() < deadline, "the line was not worked off in 120 s"
        started = Job.objects.filter(started_at__isnull=False).count()
        for job_id, place in places_from_lists(team).items():
            seen[job_id].append(place)
            # Never above what it was told less the jobs started since (counted
            # before the list was read: more may have started by then).
            assert place <= told[job_id] - started, (job_id, seen[job_id])
        time.sleep(0.2)
    while Job.objects.exclude(status=JobStatus.SUCCEEDED).exists():
        assert time.monotonic() < deadline, "the last job did not finish"
        time.sleep(0.1)

    order = list(Job.objects.order_by("started_at").values_list("pk", flat=True))
    assert order == sorted(told, key=told.__getitem__)
    for job_id, places in seen.items():
        assert places == sorted(places, reverse=True), (job_id, places)
    priorities = [Job.objects.get(pk=job_id).priority for job_id in order]
    ranks = {"high": 0, "normal": 1, "low": 2}
    assert priorities == sorted(priorities, key=ranks.__getitem__)
