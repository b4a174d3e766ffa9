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


# --- filters that do not enumerate ------------------------------------------------

LISTS = [
    "/admin/synthesis/job/",
    "/admin/synthesis/voice/",
    "/admin/quotas/ledgerentry/",
    "/admin/quotas/usageperiod/",
    "/admin/tenants/apikey/",
]


@pytest.fixture
def many_tenants(plan: Any) -> list[Any]:
    from tenants.models import Tenant

    return Tenant.objects.bulk_create(
        Tenant(slug=f"crowd-{n:04d}", name=f"Crowd {n}", plan=plan, bucket=f"chorus-crowd-{n:04d}")
        for n in range(300)
    )


def reads_of_every_row(queries: CaptureQueriesContext, table: str) -> list[str]:
    """SELECTs of a table with neither a WHERE nor a LIMIT: a read of all of it."""
    return [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith("SELECT")
        and f'FROM "{table}"' in q["sql"]
        and " WHERE " not in q["sql"]
        and " LIMIT " not in q["sql"]
        and "reltuples" not in q["sql"]
    ]


@pytest.mark.parametrize("url", LISTS)
def test_a_list_reads_no_table_whole_to_draw_its_filters(
    admin_client: Any, alice: Persona, many_tenants: list[Any], url: str
) -> None:
    if connection.vendor != "postgresql":
        pytest.fail("row estimates are PostgreSQL's (make test-postgres)")
    with connection.cursor() as cursor:  # the history's tables, as autovacuum sees them
        for table in ("synthesis_job", "quotas_ledgerentry"):
            cursor.execute(
                "UPDATE pg_class SET reltuples = %s WHERE oid = %s::regclass", [10**7, table]
            )
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(url)
        filtered = admin_client.get(url, {"tenant__id__exact": many_tenants[7].pk})

    assert page.status_code == 200
    assert filtered.status_code == 200
    # (Voices are not history: at most each plan's slots per tenant. Their list
    # counts them and offers the languages there are.)
    for table in ("tenants_tenant", "synthesis_job", "quotas_ledgerentry"):
        assert reads_of_every_row(queries, table) == [], table
    html = page.content.decode()
    assert "crowd-0299" not in html  # no tenant listed in the sidebar
    assert 'data-ajax--url="/admin/autocomplete/"' in html
    assert "select2" in html  # the autocomplete's scripts are on the page
    # Filtered, the box shows the tenant it filters by, and only that one.
    body = filtered.content.decode()
    assert str(many_tenants[7]) in body
    assert str(many_tenants[8]) not in body


def test_the_tenant_filter_filters_and_keeps_the_other_filters(
    admin_client: Any, alice: Persona, bob: Persona
) -> None:
    mine = Job.objects.create(
        tenant=alice.tenant, text="a", characters=1, status=JobStatus.FAILED, engine="espeak"
    )
    Job.objects.create(tenant=alice.tenant, text="b", characters=1, status=JobStatus.SUCCEEDED)
    Job.objects.create(tenant=bob.tenant, text="c", characters=1, status=JobStatus.FAILED)

    page = admin_client.get(
        "/admin/synthesis/job/", {"tenant__id__exact": alice.tenant.pk, "status__exact": "failed"}
    )
    by_engine = admin_client.get("/admin/synthesis/job/", {"engine": "espeak"})
    nonsense = admin_client.get("/admin/synthesis/job/", {"tenant__id__exact": "x"})

    assert [job.pk for job in page.context["cl"].result_list] == [mine.pk]
    # The search box's form carries the status filter along as a hidden field.
    assert 'type="hidden" name="status__exact" value="failed"' in page.content.decode()
    assert [job.pk for job in by_engine.context["cl"].result_list] == [mine.pk]
    assert list(nonsense.context["cl"].result_list) == []


def test_the_tenant_search_answers_from_the_tenant_admin(
    admin_client: Any, alice: Persona, many_tenants: list[Any]
) -> None:
    answer = admin_client.get(
        "/admin/autocomplete/",
        {"app_label": "synthesis", "model_name": "job", "field_name": "tenant", "term": "crowd-02"},
    )

    assert answer.status_code == 200
    found = answer.json()
    assert len(found["results"]) == 20  # a page, not every match
    assert found["pagination"]["more"] is True
    assert all("crowd-02" in r["text"] for r in found["results"])
