"""The admin's lists of jobs and ledger entries at a size where counting hurts.

Unfiltered, the lists show PostgreSQL's row estimate instead of counting every
row (twice, by default); filtered lists still count exactly; jobs are searched
by exact id, never by a scan of every job's text.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from chorus.admin_paging import ESTIMATE_ABOVE
from synthesis.models import Job, JobStatus
from tests.conftest import Persona

pytestmark = pytest.mark.django_db

ROWS = ESTIMATE_ABOVE + 500


@pytest.fixture
def many_jobs(alice: Persona) -> list[Job]:
    if connection.vendor != "postgresql":
        pytest.fail("row estimates are PostgreSQL's (make test-postgres)")
    jobs = Job.objects.bulk_create(
        Job(tenant=alice.tenant, text="An old job.", characters=11, status=JobStatus.SUCCEEDED)
        for _ in range(ROWS)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE synthesis_job")
    return jobs


def unfiltered_counts(queries: CaptureQueriesContext) -> list[str]:
    return [
        q["sql"]
        for q in queries.captured_queries
        if "COUNT(" in q["sql"].upper() and "synthesis_job" in q["sql"] and "WHERE" not in q["sql"]
    ]


def test_the_jobs_list_shows_an_estimate_instead_of_counting_every_job(
    admin_client: Any, many_jobs: list[Job]
) -> None:
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get("/admin/synthesis/job/")

    assert response.status_code == 200
    assert unfiltered_counts(queries) == []
    estimate = response.context["cl"].result_count
    assert abs(estimate - ROWS) <= ROWS * 0.1  # the planner's estimate, not a count


def test_a_filtered_jobs_list_counts_exactly(admin_client: Any, many_jobs: list[Job]) -> None:
    Job.objects.filter(pk__in=[j.pk for j in many_jobs[:3]]).update(status=JobStatus.FAILED)

    response = admin_client.get("/admin/synthesis/job/?status__exact=failed")

    assert response.status_code == 200
    assert response.context["cl"].result_count == 3


def test_jobs_are_searched_by_exact_id(admin_client: Any, many_jobs: list[Job]) -> None:
    wanted = many_jobs[1234]

    found = admin_client.get(f"/admin/synthesis/job/?q={wanted.pk}")
    words = admin_client.get("/admin/synthesis/job/?q=old job")
    unknown = admin_client.get(f"/admin/synthesis/job/?q={uuid.uuid4()}")

    assert [job.pk for job in found.context["cl"].result_list] == [wanted.pk]
    assert words.status_code == 200
    assert list(words.context["cl"].result_list) == []
    assert list(unknown.context["cl"].result_list) == []


def test_the_ledger_list_shows_an_estimate_too(admin_client: Any, alice: Persona) -> None:
    if connection.vendor != "postgresql":
        pytest.fail("row estimates are PostgreSQL's (make test-postgres)")
    with connection.cursor() as cursor:  # as autovacuum would leave it for a big table
        cursor.execute(
            "UPDATE pg_class SET reltuples = %s WHERE oid = 'quotas_ledgerentry'::regclass",
            [ROWS * 80],
        )

    response = admin_client.get("/admin/quotas/ledgerentry/")

    assert response.status_code == 200
    assert response.context["cl"].result_count == ROWS * 80
