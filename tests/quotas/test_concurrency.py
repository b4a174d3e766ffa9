"""Quota admission and settlement under concurrency, against real PostgreSQL.

Threads stand in for web processes: each submits through the service layer
(`job_create`) on its own database connection and closes it when done. The
broker is replaced by a recorder (`job_publish_created` runs on commit), so these tests
need no broker; the real-worker variant is tests/e2e/test_quota_settlement.py.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.db.models import Sum
from django.utils import timezone

from chorus.errors import ChorusError
from quotas.errors import QuotaExceeded, TooManyConcurrentJobs
from quotas.models import LedgerEntry, LedgerKind, UsagePeriod
from quotas.services import ledger_total, quota_commit, quota_refund
from synthesis.engines.base import Engine, PreparedVoice, Samples
from synthesis.models import FINISHED, IN_FLIGHT, Job, JobStatus
from synthesis.services.execution import MAX_ATTEMPTS, job_claim, job_execute
from synthesis.services.jobs import JobNotCancellable, job_cancel, job_create
from synthesis.services.sweeper import sweep
from synthesis.speech_request import SpeechRequest
from tenants.models import Tenant
from tests.conftest import Persona
from tests.fake_engines import FailingEngine

pytestmark = [pytest.mark.embedded, pytest.mark.django_db(transaction=True)]

# Enough threads to pile up on the period lock, few enough for a 2-core box and
# PostgreSQL's default max_connections (100), shared with the test runner itself.
WORKERS = 32
TEXT = "Admission is decided under the period's row lock."


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> list[uuid.UUID]:
    """Job ids handed to the 'broker': a recorder instead of Celery, so no broker is needed."""
    sent: list[uuid.UUID] = []

    def record(*, job: Job) -> bool:
        sent.append(job.id)
        return True

    # Every first message after its commit: none is under way before it.
    monkeypatch.setattr("synthesis.services.jobs.job_publish_before_commit", lambda *, job: None)
    monkeypatch.setattr("synthesis.services.jobs.job_publish_created", record)
    monkeypatch.setattr("synthesis.services.sweeper.job_publish", record)
    monkeypatch.setattr("synthesis.services.recovery.job_publish", record)
    return sent


def limit(persona: Persona, **overrides: int) -> Tenant:
    tenant = persona.tenant
    tenant.limit_overrides = overrides
    tenant.save(update_fields=["limit_overrides"])
    tenant.plan  # noqa: B018 - load it once here, not racily in every thread
    return tenant


def submit_many(persona: Persona, times: int, text: str = TEXT) -> list[Job | ChorusError]:
    def submit(_: int) -> Job | ChorusError:
        try:
            return job_create(
                tenant=persona.tenant, api_key=persona.api_key, speech=SpeechRequest(text=text)
            )
        except ChorusError as exc:
            return exc
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        return list(pool.map(submit, range(times)))


def period_of(tenant: Tenant) -> UsagePeriod:
    return UsagePeriod.objects.get(tenant=tenant)


# --- admission --------------------------------------------------------------------


def test_200_concurrent_submissions_admit_exactly_what_the_quota_holds(
    alice: Persona, published: list[uuid.UUID]
) -> None:
    tenant = limit(alice, monthly_characters=10 * len(TEXT), max_concurrent_jobs=1_000)

    results = submit_many(alice, 200)

    admitted = [r for r in results if isinstance(r, Job)]
    refused = [r for r in results if not isinstance(r, Job)]
    print(f"\nquota burst: {len(admitted)} of 200 admitted, room for 10 ({10 * len(TEXT)} chars)")
    assert len(admitted) == 10
    assert len(refused) == 190
    assert all(isinstance(r, QuotaExceeded) for r in refused), {type(r) for r in refused}
    assert Job.objects.filter(tenant=tenant).count() == 10
    reserved = LedgerEntry.objects.filter(tenant=tenant, kind=LedgerKind.RESERVE)
    assert reserved.count() == 10
    admitted_chars = sum(job.characters for job in admitted)
    assert ledger_total(tenant=tenant, kind=LedgerKind.RESERVE) == admitted_chars
    assert period_of(tenant).characters_reserved == admitted_chars == 10 * len(TEXT)
    # Fair admission let the tenant's broker slots' worth in; the rest wait, unpublished.
    queued = Job.objects.filter(tenant=tenant, status=JobStatus.QUEUED)
    assert sorted(published) == sorted(queued.values_list("pk", flat=True))
    assert len(published) == django_settings.TENANT_BROKER_SLOTS == 2  # production
    assert Job.objects.filter(tenant=tenant, status=JobStatus.PENDING).count() == 10 - len(
        published
    )


def test_the_concurrency_cap_holds_under_a_burst_and_frees_up_as_jobs_finish(
    alice: Persona, engine: Engine, published: list[uuid.UUID]
) -> None:
    tenant = limit(alice, max_concurrent_jobs=5)
    sampler = InFlightSampler(tenant)

    with sampler:
        results = submit_many(alice, 100)

    admitted = [r for r in results if isinstance(r, Job)]
    refused = [r for r in results if not isinstance(r, Job)]
    in_flight = Job.objects.filter(tenant=tenant, status__in=IN_FLIGHT).count()
    print(
        f"\nconcurrency burst: {len(admitted)} of 100 admitted, cap 5; peak in flight "
        f"{max(sampler.samples)} over {len(sampler.samples)} samples, {in_flight} after the burst"
    )
    assert len(admitted) == 5
    assert all(isinstance(r, TooManyConcurrentJobs) for r in refused), {type(r) for r in refused}
    assert max(sampler.samples) <= 5
    assert in_flight == 5
    assert period_of(tenant).characters_reserved == 5 * len(TEXT)

    # Two finish (each the next job in the broker: fair admission holds the rest
    # back), one is cancelled: three slots open, and only three.
    for _ in range(2):
        first_queued = Job.objects.filter(tenant=tenant, status=JobStatus.QUEUED).first()
        assert first_queued is not None
        job_execute(job_id=first_queued.id, engine=engine, worker="w1")
    job_cancel(tenant=tenant, job=Job.objects.filter(tenant=tenant, status__in=IN_FLIGHT)[0])
    again = submit_many(alice, 20)

    assert len([r for r in again if isinstance(r, Job)]) == 3
    assert Job.objects.filter(tenant=tenant, status__in=IN_FLIGHT).count() == 5


class InFlightSampler:
    """Counts committed queued+running jobs, as often as it can, while in use."""

    def __init__(self, tenant: Tenant) -> None:
        self.tenant = tenant
        self.samples: list[int] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        try:
            while not self.done.is_set():
                queryset = Job.objects.filter(tenant=self.tenant, status__in=IN_FLIGHT)
                self.samples.append(queryset.count())
        finally:
            connection.close()

    def __enter__(self) -> None:
        self.thread.start()

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()


# --- settlement -------------------------------------------------------------------


class CancelledMidway:
    """Yields one chunk, lets `between` run (the customer cancels), then another."""

    def __init__(self, inner: Engine, between: Callable[[], None]) -> None:
        self.name = inner.name
        self.sample_rate = inner.sample_rate
        self.between = between

    def synthesize(
        self,
        *,
        text: str,
        voice: PreparedVoice | None,
        speed: float = 1.0,
        instruction: str = "",
    ) -> Iterator[Samples]:
        yield np.full(2400, 0.1, dtype=np.float32)
        self.between()
        yield np.full(2400, 0.1, dtype=np.float32)


def _stuck(job: Job, *, attempts: int) -> None:
    """A worker claimed the job `attempts` times and died each time, long ago."""
    for n in range(attempts):
        assert job_claim(job_id=job.id, worker=f"dead-{n}") is not None
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(days=1))


def _ledger() -> list[tuple[Any, ...]]:
    return list(LedgerEntry.objects.order_by("id").values_list("job_id", "kind", "characters"))


def test_every_job_that_did_not_succeed_is_refunded_exactly_once(
    alice: Persona, engine: Engine, published: list[uuid.UUID], settings: Any
) -> None:
    # Each job is run by id in an order of this test's own, as a worker would take
    # it from the broker: all seven must be there at once.
    settings.TENANT_BROKER_SLOTS = 10
    tenant = alice.tenant

    def submit(chars: int) -> Job:
        return job_create(
            tenant=tenant, api_key=alice.api_key, speech=SpeechRequest(text="s" * chars)
        )

    succeeded = submit(11)
    engine_error = submit(13)
    worker_lost = submit(17)
    requeued_then_ok = submit(19)
    cancelled_queued = submit(23)
    cancelled_running = submit(29)
    redelivered_worn_out = submit(31)

    job_execute(job_id=succeeded.id, engine=engine, worker="w1")
    job_execute(job_id=engine_error.id, engine=FailingEngine(engine), worker="w1")  # type: ignore[arg-type]
    _stuck(worker_lost, attempts=MAX_ATTEMPTS)
    _stuck(requeued_then_ok, attempts=1)
    job_cancel(tenant=tenant, job=cancelled_queued)
    midway = CancelledMidway(
        engine, between=lambda: job_cancel(tenant=tenant, job=cancelled_running)
    )
    result = job_execute(job_id=cancelled_running.id, engine=midway, worker="w1")  # type: ignore[arg-type]
    assert result["status"] == "cancelled"
    # The broker redelivers a job whose worker died on every attempt: the claim gives up.
    _stuck(redelivered_worn_out, attempts=MAX_ATTEMPTS)
    result = job_execute(job_id=redelivered_worn_out.id, engine=engine, worker="w1")
    assert result["status"] == "skipped"

    report = sweep()

    assert (report.requeued, report.failed) == (1, 1)
    assert published.count(requeued_then_ok.id) == 2  # at submit, then by the sweeper
    requeued_then_ok.refresh_from_db()
    assert requeued_then_ok.status == JobStatus.QUEUED
    assert not LedgerEntry.objects.filter(job=requeued_then_ok).exclude(kind="reserve").exists()
    job_execute(job_id=requeued_then_ok.id, engine=engine, worker="w2")

    jobs = [
        succeeded,
        engine_error,
        worker_lost,
        requeued_then_ok,
        cancelled_queued,
        cancelled_running,
        redelivered_worn_out,
    ]
    status = {job.id: Job.objects.get(pk=job.id).status for job in jobs}
    assert [status[job.id] for job in jobs] == [
        JobStatus.SUCCEEDED,
        JobStatus.FAILED,
        JobStatus.FAILED,
        JobStatus.SUCCEEDED,
        JobStatus.CANCELLED,
        JobStatus.CANCELLED,
        JobStatus.FAILED,
    ]
    for job in jobs:
        kinds = sorted(LedgerEntry.objects.filter(job=job).values_list("kind", flat=True))
        expected = "commit" if status[job.id] == JobStatus.SUCCEEDED else "refund"
        assert kinds == sorted(["reserve", expected]), (job.text, kinds)

    # Settling again changes nothing: no second refund, no late charge.
    before, period_before = _ledger(), period_of(tenant)
    for job in jobs:
        assert quota_refund(job_id=job.id) is False
        assert quota_commit(job_id=job.id) is False
    assert _ledger() == before
    period = period_of(tenant)
    assert (period.characters_used, period.characters_reserved) == (
        period_before.characters_used,
        period_before.characters_reserved,
    )

    reserved = ledger_total(tenant=tenant, kind=LedgerKind.RESERVE)
    committed = ledger_total(tenant=tenant, kind=LedgerKind.COMMIT)
    refunded = ledger_total(tenant=tenant, kind=LedgerKind.REFUND)
    drift = reserved - committed - refunded - period.characters_reserved
    print(
        f"\nsettlement: reserved {reserved}, committed {committed}, refunded {refunded}, "
        f"still reserved {period.characters_reserved}, refund drift {drift}"
    )
    assert drift == 0
    assert committed == period.characters_used == 11 + 19
    assert refunded == 13 + 17 + 23 + 29 + 31
    assert period.characters_reserved == 0


def test_racing_settlements_of_one_job_settle_it_once(
    alice: Persona, published: list[uuid.UUID]
) -> None:
    jobs = [
        job_create(
            tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="r" * (n + 1))
        )
        for n in range(8)
    ]

    def settle(call: tuple[Job, Callable[..., bool]]) -> bool:
        job, settle_once = call
        try:
            return settle_once(job_id=job.id)
        finally:
            connection.close()

    calls = [(job, fn) for job in jobs for fn in (quota_commit, quota_refund) * 5]
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        outcomes = list(pool.map(settle, calls))

    for job in jobs:
        wins = [won for (j, _), won in zip(calls, outcomes, strict=True) if j is job and won]
        assert wins == [True]
        assert LedgerEntry.objects.filter(job=job).exclude(kind="reserve").count() == 1
    period = period_of(alice.tenant)
    committed = ledger_total(tenant=alice.tenant, kind=LedgerKind.COMMIT)
    refunded = ledger_total(tenant=alice.tenant, kind=LedgerKind.REFUND)
    assert period.characters_reserved == 0
    assert period.characters_used == committed
    assert committed + refunded == sum(job.characters for job in jobs)


def test_a_cancel_racing_the_worker_either_charges_or_refunds_never_both(
    alice: Persona, engine: Engine, published: list[uuid.UUID]
) -> None:
    jobs = [
        job_create(
            tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text=f"race {n} " * 3)
        )
        for n in range(12)
    ]

    def run(call: tuple[str, Job]) -> None:
        what, job = call
        try:
            if what == "execute":
                job_execute(job_id=job.id, engine=engine, worker="racer")
            else:
                # JobNotCancellable when the worker finished first.
                with contextlib.suppress(JobNotCancellable):
                    job_cancel(tenant=alice.tenant, job=job)
        finally:
            connection.close()

    calls = [(what, job) for job in jobs for what in ("execute", "cancel")]
    with ThreadPoolExecutor(max_workers=12) as pool:
        list(pool.map(run, calls))

    for job in jobs:
        job.refresh_from_db()
        assert job.status in FINISHED
        settlements = list(
            LedgerEntry.objects.filter(job=job).exclude(kind="reserve").values_list("kind")
        )
        expected = "commit" if job.status == JobStatus.SUCCEEDED else "refund"
        assert settlements == [(expected,)]
    period = period_of(alice.tenant)
    succeeded = Job.objects.filter(tenant=alice.tenant, status=JobStatus.SUCCEEDED)
    assert period.characters_used == (succeeded.aggregate(n=Sum("characters"))["n"] or 0)
    assert period.characters_reserved == 0
