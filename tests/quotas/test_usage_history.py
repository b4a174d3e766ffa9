"""The migration that fills the job counters of periods older than the counters
themselves, before row retention may delete the rows they summarise."""

from __future__ import annotations

import importlib
from datetime import timedelta

import pytest
from django.apps import apps
from django.utils import timezone

from quotas.counters import Settled, period_recount
from quotas.models import LedgerEntry, LedgerKind, UsagePeriod
from quotas.services import usage_period_current
from synthesis.models import Job, JobStatus
from tests.conftest import Persona

fill = importlib.import_module("quotas.migrations.0004_usage_history").count_older_periods

pytestmark = pytest.mark.django_db


def settled_job(persona: Persona, period: UsagePeriod, status: str, kind: str) -> None:
    job = Job.objects.create(
        tenant=persona.tenant, text="old", characters=3, status=status, duration_s=1.25
    )
    for entry in (LedgerKind.RESERVE, kind):
        LedgerEntry.objects.create(
            tenant=persona.tenant, period=period, job=job, kind=entry, characters=3
        )


def test_old_periods_get_their_counters_from_the_ledger_and_recent_ones_are_left(
    alice: Persona,
) -> None:
    then = timezone.now() - timedelta(days=90)
    old = usage_period_current(tenant=alice.tenant, now=then)
    current = usage_period_current(tenant=alice.tenant)
    for status, kind in [
        (JobStatus.SUCCEEDED, LedgerKind.COMMIT),
        (JobStatus.SUCCEEDED, LedgerKind.COMMIT),
        (JobStatus.FAILED, LedgerKind.REFUND),
        (JobStatus.CANCELLED, LedgerKind.REFUND),
    ]:
        settled_job(alice, old, status, kind)
        settled_job(alice, current, status, kind)

    fill(apps, None)
    fill(apps, None)  # a second run sets the same figures

    old.refresh_from_db()
    current.refresh_from_db()
    counters = (old.jobs_succeeded, old.jobs_failed, old.jobs_cancelled, old.audio_ms)
    assert Settled(*counters) == period_recount(period_id=old.pk) == Settled(2, 1, 1, 2500)
    # The current period's counters are the services' (and the sweeper's) to keep.
    assert (current.jobs_succeeded, current.jobs_failed, current.audio_ms) == (0, 0, 0)
