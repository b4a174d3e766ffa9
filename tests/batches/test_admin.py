"""The admin's batch pages at a size where a batch's items no longer fit a page:
the list reads no items, a batch's page shows one page of them at a time."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from batches.models import Batch, BatchItem
from synthesis.models import Job, JobStatus
from tests.conftest import Persona

pytestmark = [pytest.mark.embedded, pytest.mark.django_db]

ITEMS = 2_000
ITEMS_PER_PAGE = 50
# The page's own queries (session, user, the batch, its items, the paging's
# count), whatever the batch's size.
MOST_QUERIES = 12


@pytest.fixture
def big_batch(alice: Persona) -> Batch:
    """A batch of 2,000 items, written in bulk (admitting it item by item is
    not the subject here)."""
    batch = Batch.objects.create(
        tenant=alice.tenant, priority="low", item_count=ITEMS, characters=ITEMS * 12
    )
    jobs = Job.objects.bulk_create(
        Job(
            tenant=alice.tenant,
            text=f"Item {n:04d}.",
            characters=10,
            priority="low",
            status=JobStatus.PENDING,
            in_batch=True,
        )
        for n in range(ITEMS)
    )
    BatchItem.objects.bulk_create(
        BatchItem(batch=batch, index=n, custom_id=f"row-{n:04d}", job=job)
        for n, job in enumerate(jobs)
    )
    return batch


def shown_items(response: Any) -> list[str]:
    return re.findall(r"row-\d{4}", response.content.decode())


def page_of(batch: Batch, query: str = "") -> str:
    return f"/admin/batches/batch/{batch.pk}/change/{query}"


def test_the_batch_list_reads_no_items(admin_client: Any, big_batch: Batch) -> None:
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get("/admin/batches/batch/")

    assert response.status_code == 200
    assert str(big_batch.pk) in response.content.decode()
    assert len(queries) <= MOST_QUERIES
    read = " ".join(q["sql"] for q in queries.captured_queries)
    assert BatchItem._meta.db_table not in read
    assert Job._meta.db_table not in read


def test_a_batchs_page_shows_its_first_items_only(admin_client: Any, big_batch: Batch) -> None:
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(page_of(big_batch))

    assert response.status_code == 200
    assert len(queries) <= MOST_QUERIES
    assert shown_items(response) == [f"row-{n:04d}" for n in range(ITEMS_PER_PAGE)]
    assert f"of {ITEMS:,}" in response.content.decode()
    assert len(response.content) < 150_000  # 2,000 items' rows would be megabytes


def test_a_batchs_items_are_paged_in_submitted_order(admin_client: Any, big_batch: Batch) -> None:
    last = ITEMS // ITEMS_PER_PAGE  # pages count from 1

    second = admin_client.get(page_of(big_batch, "?items=2"))
    final = admin_client.get(page_of(big_batch, f"?items={last}"))
    beyond = admin_client.get(page_of(big_batch, f"?items={last + 5}"))
    junk = admin_client.get(page_of(big_batch, "?items=many"))

    assert second.status_code == 200
    assert shown_items(second) == [
        f"row-{n:04d}" for n in range(ITEMS_PER_PAGE, 2 * ITEMS_PER_PAGE)
    ]
    assert shown_items(final)[-1] == f"row-{ITEMS - 1:04d}"
    assert shown_items(beyond) == shown_items(final)  # past the end: the last page
    assert shown_items(junk) == shown_items(admin_client.get(page_of(big_batch)))


def test_an_item_links_to_its_job(admin_client: Any, big_batch: Batch) -> None:
    first = BatchItem.objects.get(batch=big_batch, index=0)

    response = admin_client.get(page_of(big_batch))

    assert f"/admin/synthesis/job/{first.job_id}/change/" in response.content.decode()
    assert "pending" in response.content.decode()


def test_someone_not_staff_is_sent_to_the_login(client: Any, big_batch: Batch) -> None:
    response = client.get(page_of(big_batch))

    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]
