"""Reads on the request path: what they answer, and that they stay index lookups.

The plan checks run on PostgreSQL with sequential scans switched off: on a small
test table the planner would rightly prefer one, but what matters here is that an
index fits the query, so a table of millions is not scanned.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from synthesis.models import Job, JobStatus
from synthesis.selectors import _recent_service_seconds, _recent_successes
from tests.conftest import Persona

on_postgresql = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="reads PostgreSQL's query plans"
)


def plan_of(queryset: QuerySet[Any]) -> str:
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")
        return queryset.explain()


def finished(persona: Persona, *, ago_s: float, took_s: float, status: str = "succeeded") -> Job:
    end = timezone.now() - timedelta(seconds=ago_s)
    return Job.objects.create(
        tenant=persona.tenant,
        text="x",
        characters=1,
        status=status,
        started_at=end - timedelta(seconds=took_s),
        finished_at=end,
    )


def test_the_service_time_is_the_mean_of_the_latest_fifty_successes(alice: Persona) -> None:
    for n in range(50):
        finished(alice, ago_s=n, took_s=2.0)
    for n in range(20):
        finished(alice, ago_s=100 + n, took_s=50.0)  # older: not in the sample
    finished(alice, ago_s=0.5, took_s=99.0, status=JobStatus.FAILED)  # not a success

    assert _recent_service_seconds() == pytest.approx(2.0)


def test_without_any_success_there_is_no_service_time(alice: Persona) -> None:
    finished(alice, ago_s=1, took_s=3.0, status=JobStatus.FAILED)

    assert _recent_service_seconds() is None


@on_postgresql
def test_the_service_time_reads_the_end_of_an_index(alice: Persona) -> None:
    plan = plan_of(_recent_successes(50))

    assert "job_recent_success" in plan, plan
    assert "Sort" not in plan, plan
