"""A job's first message leaves before its row's commit, under the tenant's lock
(`dispatch.job_publish_before_commit`): a worker that claims before the commit
waits for it, and a submit that rolls back leaves a message that claims nothing.
PostgreSQL and Redis, real connections; the submit is held at its last round
trip by a wrapper around that round trip."""

from __future__ import annotations

import base64
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.db import DatabaseError, connection

from quotas.models import LedgerEntry, UsagePeriod
from synthesis import tasks
from synthesis.models import Job, JobStatus
from synthesis.services import dispatch, execution, jobs
from synthesis.services.dispatch import BEFORE_COMMIT_HEADER, sent_before_commit
from synthesis.services.execution import job_claim
from synthesis.services.jobs import job_create
from synthesis.speech_request import SpeechRequest
from tests.conftest import Persona

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's locks"),
]


def submit(persona: Persona, idempotency_key: str = "") -> Job:
    return job_create(
        tenant=persona.tenant,
        api_key=None,
        speech=SpeechRequest(text="Hi there."),
        idempotency_key=idempotency_key,
    )


class HeldSubmit:
    """A submit in a thread of its own, held before its row's round trip (the
    tenant's lock taken, the message sent) until `go` is set. With an
    Idempotency-Key that round trip does not commit: the key's row follows."""

    def __init__(
        self,
        persona: Persona,
        monkeypatch: pytest.MonkeyPatch,
        fail: bool = False,
        idempotency_key: str = "",
    ):
        self.at_last_round_trip = threading.Event()
        self.go = threading.Event()
        self.outcome: list[Any] = []
        name = "execute_together" if idempotency_key else "execute_and_commit"
        real = getattr(jobs, name)

        def held(statements: Any) -> Any:
            if any(statement.name == "insert_synthesis_job" for statement in statements):
                self.at_last_round_trip.set()
                assert self.go.wait(timeout=10)
                if fail:
                    raise DatabaseError("the commit failed")
            return real(statements)

        monkeypatch.setattr(jobs, name, held)
        self.thread = threading.Thread(target=self._run, args=(persona, idempotency_key))
        self.thread.start()
        assert self.at_last_round_trip.wait(timeout=10)

    def _run(self, persona: Persona, idempotency_key: str) -> None:
        try:
            self.outcome.append(submit(persona, idempotency_key))
        except Exception as error:
            self.outcome.append(error)
        finally:
            connection.close()

    def finish(self) -> Any:
        self.go.set()
        self.thread.join(timeout=10)
        return self.outcome[0]


def sent(broker: redis.Redis) -> tuple[str, int, dict[str, Any]]:
    """The one message in the queue (the send runs on a thread of its own)."""
    deadline = time.monotonic() + 5
    while not (found := broker.lrange("synth.normal", 0, -1)) and time.monotonic() < deadline:
        time.sleep(0.01)
    [raw] = found
    message = json.loads(raw)
    job_id, epoch = json.loads(base64.b64decode(message["body"]))[0][:2]
    return job_id, epoch, message["headers"]


def assert_nothing_written() -> None:
    assert not Job.objects.exists()
    assert not LedgerEntry.objects.exists()
    assert not UsagePeriod.objects.filter(characters_reserved__gt=0).exists()


@pytest.fixture(autouse=True)
def send_ahead_not_paused(monkeypatch: pytest.MonkeyPatch) -> None:
    """No pause left by an earlier test's failed or stalled send."""
    monkeypatch.setattr(dispatch, "_send_ahead_paused_until", 0.0)


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


def waiting_for_the_tenants_lock(tenant_id: int) -> int:
    """Sessions of this database waiting for the tenant's advisory lock (its
    key's low 32 bits are the tenant's id)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND objid = %s AND database = (SELECT oid FROM pg_database"
            " WHERE datname = current_database())",
            [tenant_id],
        )
        return int(cursor.fetchone()[0])


@pytest.mark.parametrize("idempotency_key", ["", "order-7"])
def test_a_claim_before_the_commit_waits_for_it(
    alice: Persona,
    broker: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    held: list[HeldSubmit],
    idempotency_key: str,
) -> None:
    held.append(submit_ := HeldSubmit(alice, monkeypatch, idempotency_key=idempotency_key))
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
    assert worker.is_alive()  # waiting for the submit's lock, in PostgreSQL
    assert not claims
    assert waiting_for_the_tenants_lock(alice.tenant.pk) == 1

    submit_.finish()
    worker.join(timeout=2)  # at once, not after a wait of its own
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


def test_a_claim_gives_up_on_a_submit_that_holds_its_lock_too_long(
    alice: Persona,
    broker: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    held: list[HeldSubmit],
) -> None:
    monkeypatch.setattr(execution, "SUBMIT_WAIT_S", 0.3)
    held.append(submit_ := HeldSubmit(alice, monkeypatch))
    job_id, epoch, _ = sent(broker)

    assert job_claim(job_id=job_id, worker="w", epoch=epoch, before_commit=alice.tenant.pk) is None
    job = submit_.finish()
    # Not given up: queued, without a message, as a lost one is (the sweeper's).
    assert Job.objects.get(pk=job.pk).status == JobStatus.QUEUED


def test_a_send_before_the_commit_that_fails_is_made_after_it_under_a_new_epoch(
    alice: Persona, broker: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kombu.exceptions import OperationalError

    real = tasks.publish_task
    tries: list[dict[str, Any]] = []

    def once_down(*args: Any, **kwargs: Any) -> Any:
        tries.append(kwargs["retry_policy"])
        if BEFORE_COMMIT_HEADER in kwargs["headers"]:
            raise OperationalError("connection reset")  # it may have got through
        return real(*args, **kwargs)

    monkeypatch.setattr(tasks, "publish_task", once_down)
    job = submit(alice)

    assert tries[0] == {"max_retries": 0}  # tried once, holding the tenant's lock
    job_id, epoch, headers = sent(broker)
    assert (job_id, epoch) == (str(job.pk), 2)
    assert BEFORE_COMMIT_HEADER not in headers
    assert Job.objects.get(pk=job.pk).status == JobStatus.QUEUED


def last_round_trip_watched(monkeypatch: pytest.MonkeyPatch, seen: Callable[[], None]) -> None:
    """Calls `seen` as the submit's last round trip (the row, its reservation,
    the commit) starts."""
    real = jobs.execute_and_commit

    def watched(statements: Any) -> Any:
        if any(statement.name == "insert_synthesis_job" for statement in statements):
            seen()
        return real(statements)

    monkeypatch.setattr(jobs, "execute_and_commit", watched)


def test_the_message_is_on_the_broker_before_the_last_round_trip_starts(
    alice: Persona, broker: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Waiting for the send lets it leave without taking turns for the
    # interpreter with the round trip's own Python. A generous wait, a send
    # thread already idle, and threads that give way only where they block:
    # neither a slow host nor the scheduler's timing decides this.
    monkeypatch.setattr(dispatch, "SEND_AHEAD_WAIT_S", 10)
    dispatch._senders.get().submit(lambda: None).result(timeout=5)
    queued_then: list[int] = []
    last_round_trip_watched(monkeypatch, lambda: queued_then.append(broker.llen("synth.normal")))

    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    try:
        job = submit(alice)
    finally:
        sys.setswitchinterval(switch_interval)

    assert queued_then == [1]
    assert sent(broker)[:2] == (str(job.pk), 1)


def test_a_send_that_stalls_holds_the_last_round_trip_no_longer_than_its_wait(
    alice: Persona, broker: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dispatch, "SEND_AHEAD_WAIT_S", 0.3)
    release = threading.Event()
    real = dispatch.send_synthesis

    def stalled(*args: Any) -> None:
        assert release.wait(timeout=10)
        real(*args)

    monkeypatch.setattr(dispatch, "send_synthesis", stalled)
    started = time.monotonic()
    waited: list[float] = []

    def seen() -> None:
        waited.append(time.monotonic() - started)
        release.set()  # the broker is back once the round trip is on its way

    last_round_trip_watched(monkeypatch, seen)

    job = submit(alice)

    [before_round_trip] = waited
    assert 0.3 <= before_round_trip < 3  # the wait's bound, not the stall's
    assert sent(broker)[:2] == (str(job.pk), 1)
    assert Job.objects.get(pk=job.pk).status == JobStatus.QUEUED

    # The broker stalled: for a while the next submits do not wait at all.
    broker.delete("synth.normal")
    release.clear()
    started = time.monotonic()
    waited.clear()
    second = submit(alice)
    [before_round_trip] = waited
    assert before_round_trip < 0.3
    assert sent(broker)[:2] == (str(second.pk), 1)


@pytest.mark.parametrize("value", [None, True, "7", 0, -3, 1 << 32, 2.0])
def test_a_header_of_another_form_is_no_tenant(value: Any) -> None:
    assert sent_before_commit({BEFORE_COMMIT_HEADER: value}) is None
    assert sent_before_commit({BEFORE_COMMIT_HEADER: 7}) == 7
