"""Jobs of dead workers, and jobs whose message is gone, go back to their queue.

Real PostgreSQL and the real Redis the broker uses: messages are really
published and looked for where kombu keeps them."""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.utils import timezone

from quotas.models import LedgerEntry
from synthesis.models import Job, JobStatus, WorkerHeartbeat
from synthesis.services.execution import MAX_ATTEMPTS, job_claim
from synthesis.services.jobs import job_create
from synthesis.services.recovery import (
    jobs_hand_back,
    jobs_republish_lost_messages,
    jobs_requeue_from_dead_workers,
)
from synthesis.speech_request import SpeechRequest
from tests.conftest import Persona

pytestmark = pytest.mark.django_db(transaction=True)

HOST = socket.gethostname()


def submit(persona: Persona) -> Job:
    return job_create(
        tenant=persona.tenant, api_key=persona.api_key, speech=SpeechRequest(text="Bring me back.")
    )


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def running_on(job: Job, worker: str, *, started_ago: float = 0.0) -> Job:
    assert job_claim(job_id=job.id, worker=worker, epoch=job.epoch) is not None
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(seconds=started_ago))
    return Job.objects.get(pk=job.pk)


def beat(name: str, *, ago: float) -> None:
    now = timezone.now()
    WorkerHeartbeat.objects.create(
        name=name,
        engine="synthetic",
        device="emulated:emu0",
        started_at=now - timedelta(minutes=5),
        seen_at=now - timedelta(seconds=ago),
    )


def messages(broker: redis.Redis, queue: str = "synth.normal") -> list[tuple[str, int]]:
    found = []
    for raw in broker.lrange(queue, 0, -1):
        headers = json.loads(raw)["headers"]
        job_id, epoch = ast.literal_eval(headers["argsrepr"])
        found.append((job_id, epoch))
    return found


def test_a_job_of_a_dead_process_on_this_host_is_requeued_at_once(
    alice: Persona, broker: redis.Redis
) -> None:
    job = running_on(submit(alice), f"{HOST}:{dead_pid()}")
    broker.delete("synth.normal")

    assert jobs_requeue_from_dead_workers(host=HOST) == {"requeued": 1, "failed": 0}

    job.refresh_from_db()
    assert (job.status, job.epoch) == (JobStatus.QUEUED, 2)
    assert messages(broker) == [(str(job.id), 2)]


def test_a_live_process_keeps_its_jobs_whatever_its_heartbeat_says(
    alice: Persona, broker: redis.Redis
) -> None:
    job = running_on(submit(alice), f"{HOST}:{os.getpid()}", started_ago=60)

    assert jobs_requeue_from_dead_workers(host=HOST) == {"requeued": 0, "failed": 0}
    assert Job.objects.get(pk=job.pk).status == JobStatus.RUNNING


def test_a_worker_elsewhere_is_judged_by_its_heartbeat(
    alice: Persona, bob: Persona, broker: redis.Redis
) -> None:
    silent = running_on(submit(alice), "gpu-7:41", started_ago=60)
    beat("gpu-7:41", ago=30)
    alive = running_on(submit(bob), "gpu-8:41", started_ago=60)
    beat("gpu-8:41", ago=1)

    assert jobs_requeue_from_dead_workers(host=HOST) == {"requeued": 1, "failed": 0}
    assert Job.objects.get(pk=silent.pk).status == JobStatus.QUEUED
    assert Job.objects.get(pk=alive.pk).status == JobStatus.RUNNING


def test_a_worn_out_job_of_a_dead_worker_fails_and_is_refunded(
    alice: Persona, broker: redis.Redis
) -> None:
    job = submit(alice)
    Job.objects.filter(pk=job.pk).update(attempts=MAX_ATTEMPTS - 1)
    job = running_on(Job.objects.get(pk=job.pk), f"{HOST}:{dead_pid()}")

    assert jobs_requeue_from_dead_workers(host=HOST) == {"requeued": 0, "failed": 1}
    job.refresh_from_db()
    assert (job.status, job.error_code) == (JobStatus.FAILED, "worker_lost")


def test_a_draining_worker_hands_back_its_running_jobs_and_no_others(
    alice: Persona, bob: Persona, broker: redis.Redis
) -> None:
    mine = running_on(submit(alice), "gpu-1:7")
    other = running_on(submit(bob), "gpu-2:7")
    broker.delete("synth.normal")

    assert jobs_hand_back(worker="gpu-1:7") == {"requeued": 1, "failed": 0}

    mine.refresh_from_db()
    # Back in the line under a new epoch, its attempt here superseded (a newer
    # claim takes attempt 2); nothing charged or refunded yet.
    assert (mine.status, mine.epoch, mine.attempts) == (JobStatus.QUEUED, 2, 1)
    assert messages(broker) == [(str(mine.pk), 2)]
    assert list(LedgerEntry.objects.filter(job_id=mine.pk).values_list("kind", flat=True)) == [
        "reserve"
    ]
    assert Job.objects.get(pk=other.pk).status == JobStatus.RUNNING
    assert job_claim(job_id=mine.pk, worker="gpu-1:7", epoch=1) is None  # the old message
    assert job_claim(job_id=mine.pk, worker="gpu-3:7", epoch=2) is not None


def test_a_worn_out_job_handed_back_fails_and_is_refunded(
    alice: Persona, broker: redis.Redis
) -> None:
    job = submit(alice)
    Job.objects.filter(pk=job.pk).update(attempts=MAX_ATTEMPTS - 1)
    job = running_on(Job.objects.get(pk=job.pk), "gpu-1:7")

    assert jobs_hand_back(worker="gpu-1:7") == {"requeued": 0, "failed": 1}
    job.refresh_from_db()
    assert (job.status, job.error_code) == (JobStatus.FAILED, "worker_lost")
    kinds = sorted(LedgerEntry.objects.filter(job_id=job.pk).values_list("kind", flat=True))
    assert kinds == ["refund", "reserve"]


def test_a_queued_job_whose_message_is_gone_is_republished(
    alice: Persona, broker: redis.Redis
) -> None:
    kept, lost = submit(alice), submit(alice)
    assert sorted(messages(broker)) == sorted([(str(kept.id), 1), (str(lost.id), 1)])
    # The message of `lost` vanished (popped by a worker killed before it
    # recorded the delivery); `kept`'s still waits in its queue.
    broker.lrem(
        "synth.normal",
        0,
        broker.lrange("synth.normal", 0, -1)[messages(broker).index((str(lost.id), 1))],
    )
    Job.objects.update(published_at=timezone.now() - timedelta(seconds=30))

    assert jobs_republish_lost_messages() == 1

    assert sorted(messages(broker)) == sorted([(str(kept.id), 1), (str(lost.id), 2)])
    assert jobs_republish_lost_messages() == 0  # found now: not published again


def test_a_submit_that_died_between_its_commit_and_its_send_is_republished(
    alice: Persona, broker: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The web process stops right after the commit: the send never happens (a
    # submit that sends after its commit: SQLite's, or one inside a transaction).
    monkeypatch.setattr("synthesis.services.jobs.job_publish_before_commit", lambda *, job: None)
    monkeypatch.setattr("synthesis.services.jobs.job_publish_created", lambda *, job: True)
    job = submit(alice)
    assert (job.status, messages(broker)) == (JobStatus.QUEUED, [])
    assert job.published_at is not None  # stamped by the INSERT, not after the send

    assert jobs_republish_lost_messages() == 0  # not before it is LOST_AFTER_S old
    Job.objects.update(published_at=timezone.now() - timedelta(seconds=30))
    assert jobs_republish_lost_messages() == 1

    assert messages(broker) == [(str(job.id), 2)]


def test_a_message_held_by_a_dead_worker_is_dropped_and_republished(
    alice: Persona, broker: redis.Redis
) -> None:
    job = submit(alice)
    raw = broker.rpop("synth.normal")
    message = json.loads(raw)
    # As kombu records a delivery: [message, exchange, routing key] by tag.
    broker.hset("unacked", "tag-1", json.dumps([message, "synth.normal", "synth.normal"]))
    broker.zadd("unacked_index", {"tag-1": timezone.now().timestamp()})
    Job.objects.update(published_at=timezone.now() - timedelta(seconds=30))

    assert jobs_republish_lost_messages() == 0  # just delivered: a live worker claims it

    broker.zadd("unacked_index", {"tag-1": timezone.now().timestamp() - 30})
    assert jobs_republish_lost_messages() == 1
    assert broker.hget("unacked", "tag-1") is None
    assert messages(broker) == [(str(job.id), 2)]
    broker.delete("unacked", "unacked_index")


def test_nothing_is_republished_before_its_publish_is_old_enough(
    alice: Persona, broker: redis.Redis, settings: Any
) -> None:
    submit(alice)
    broker.delete("synth.normal")
    assert jobs_republish_lost_messages() == 0
