"""A job's first message leaves before its row's commit, under the tenant's lock
(`dispatch.job_publish_before_commit`): a worker that claims before the commit
waits for it, and a submit that rolls back leaves a message that claims nothing.
PostgreSQL and Redis, real connections; the submit is held at its last round
trip by a wrapper around that round trip."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.db import DatabaseError, connection

from quotas.models import LedgerEntry, UsagePeriod
from synthesis.models import Job, JobStatus
from synthesis.services import jobs
from synthesis.services.dispatch import BEFORE_COMMIT_HEADER, sent_before_commit
from synthesis.services.execution import job_claim
from synthesis.services.jobs import QueueUnavailable, job_create
from synthesis.speech_request import SpeechRequest
from tests.conftest import Persona

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's locks"),
]


def submit(persona: Persona) -> Job:
    return job_create(tenant=persona.tenant, api_key=None, speech=SpeechRequest(text="Hi there."))


class HeldSubmit:
    """A submit in a thread of its own, held before its row's round trip (the
    tenant's lock taken, the message sent) until `go` is set."""

    def __init__(self, persona: Persona, monkeypatch: pytest.MonkeyPatch, fail: bool = False):
        self.at_last_round_trip = threading.Event()
        self.go = threading.Event()
        self.outcome: list[Any] = []
        real = jobs.execute_and_commit

        def held(statements: Any) -> Any:
            self.at_last_round_trip.set()
            assert self.go.wait(timeout=10)
            if fail:
                raise DatabaseError("the commit failed")
            return real(statements)

        monkeypatch.setattr(jobs, "execute_and_commit", held)
        self.thread = threading.Thread(target=self._run, args=(persona,))
        self.thread.start()
        assert self.at_last_round_trip.wait(timeout=10)

    def _run(self, persona: Persona) -> None:
        try:
            self.outcome.append(submit(persona))
        except Exception as error:
            self.outcome.append(error)
        finally:
            connection.close()

    def finish(self) -> Any:
        self.go.set()
        self.thread.join(timeout=10)
        return self.outcome[0]


def sent(broker: redis.Redis) -> tuple[str, int, dict[str, Any]]:
    [raw] = broker.lrange("synth.normal", 0, -1)
    message = json.loads(raw)
    job_id, epoch = json.loads(base64.b64decode(message["body"]))[0][:2]
    return job_id, epoch, message["headers"]


def assert_nothing_written() -> None:
    assert not Job.objects.exists()
    assert not LedgerEntry.objects.exists()
    assert not UsagePeriod.objects.filter(characters_reserved__gt=0).exists()


@pytest.fixture
def held(alice: Persona, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[HeldSubmit]]:
    made: list[HeldSubmit] = []
    yield made
    for submit_ in made:
        submit_.go.set()
        submit_.thread.join(timeout=10)


def test_the_message_is_sent_before_the_row_is_committed(
    alice: Persona, broker: redis.Redis, monkeypatch: pytest.MonkeyPatch, held: list[HeldSubmit]
) -> None:
    held.append(submit_ := HeldSubmit(alice, monkeypatch))
    job_id, epoch, headers = sent(broker)
    assert not Job.objects.filter(pk=job_id).exists()  # not committed yet
    assert headers[BEFORE_COMMIT_HEADER] == alice.tenant.pk
    job = submit_.finish()
    assert (str(job.pk), epoch, job.status) == (job_id, 1, JobStatus.QUEUED)


def test_a_claim_before_the_commit_waits_for_it(
    alice: Persona, broker: redis.Redis, monkeypatch: pytest.MonkeyPatch, held: list[HeldSubmit]
) -> None:
    held.append(submit_ := HeldSubmit(alice, monkeypatch))
    job_id, epoch, headers = sent(broker)
    # Without the header's tenant, such a claim finds nothing and gives the message up.
    assert job_claim(job_id=job_id, worker="w:1", epoch=epoch) is None

    claims: list[Any] = []

    def claim() -> None:
        try:
            tenant_id = sent_before_commit(headers)
            claims.append(
                job_claim(job_id=job_id, worker="w:2", epoch=epoch, before_commit=tenant_id)
            )
        finally:
            connection.close()

    worker = threading.Thread(target=claim)
    worker.start()
    worker.join(timeout=0.5)
    assert worker.is_alive()  # waiting for the submit's lock
    assert not claims

    submit_.finish()
    worker.join(timeout=10)
    [claimed] = claims
    assert claimed is not None
    assert str(claimed.job.pk) == job_id
    assert Job.objects.get(pk=job_id).status == JobStatus.RUNNING


def test_a_submit_that_rolls_back_after_its_send_leaves_a_message_that_claims_nothing(
    alice: Persona, broker: redis.Redis, monkeypatch: pytest.MonkeyPatch, held: list[HeldSubmit]
) -> None:
    held.append(submit_ := HeldSubmit(alice, monkeypatch, fail=True))
    job_id, epoch, _ = sent(broker)
    assert isinstance(submit_.finish(), DatabaseError)

    assert job_claim(job_id=job_id, worker="w", epoch=epoch, before_commit=alice.tenant.pk) is None
    assert_nothing_written()


def test_a_send_that_fails_writes_nothing(
    alice: Persona, broker: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kombu.exceptions import OperationalError

    def broker_down(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("connection refused")

    monkeypatch.setattr("synthesis.tasks.publish_task", broker_down)
    with pytest.raises(QueueUnavailable):
        submit(alice)
    assert_nothing_written()


@pytest.mark.parametrize("value", [None, True, "7", 0, -3, 1 << 32, 2.0])
def test_a_header_of_another_form_is_no_tenant(value: Any) -> None:
    assert sent_before_commit({BEFORE_COMMIT_HEADER: value}) is None
    assert sent_before_commit({BEFORE_COMMIT_HEADER: 7}) == 7
