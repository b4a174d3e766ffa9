"""Events tenants can subscribe to, and the one way to publish them.

`event_publish` records the event and one delivery per enabled endpoint of the
tenant subscribed to its type, in the caller's transaction; the deliveries are
queued when it commits, so an ending that is rolled back sends nothing.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from batches.models import Batch
from batches.selectors import batch_counts
from synthesis.models import Job, JobStatus
from webhooks.models import EVENT_TYPES, WebhookDelivery, WebhookEndpoint, WebhookEvent
from webhooks.services.deliveries import deliveries_publish_on_commit

log = logging.getLogger("chorus.webhooks")

JOB_EVENTS = {JobStatus.SUCCEEDED: "speech.succeeded", JobStatus.FAILED: "speech.failed"}


def event_publish(*, tenant_id: int, event_type: str, data: dict[str, Any]) -> WebhookEvent | None:
    """Publish `event_type` with `data` (JSON-able) to the tenant's endpoints.

    Returns the event, or None when no enabled endpoint takes this type (then
    nothing is stored)."""
    if event_type not in EVENT_TYPES:
        raise ValueError(f"unknown webhook event type {event_type!r}")
    endpoints = [
        endpoint
        for endpoint in WebhookEndpoint.objects.filter(tenant_id=tenant_id, enabled=True).only(
            "id", "event_types"
        )
        # Filtered here, not with a JSON lookup: SQLite has no `contains`, and a
        # tenant has a handful of endpoints.
        if event_type in endpoint.event_types
    ]
    if not endpoints:
        return None
    now = timezone.now()
    with transaction.atomic():
        event = WebhookEvent.objects.create(tenant_id=tenant_id, type=event_type, data=data)
        deliveries = WebhookDelivery.objects.bulk_create(
            WebhookDelivery(event=event, endpoint=endpoint, next_attempt_at=now)
            for endpoint in endpoints
        )
        deliveries_publish_on_commit(deliveries, delay_s=0)
    return event


def job_event_publish(*, job_id: Any, tenant_id: int, status: str) -> None:
    """`speech.succeeded` or `speech.failed` for a job that just ended (other
    endings send nothing). Never fails the ending it reports: an error here is
    logged, and only this event's rows are rolled back (`event_publish` writes
    in a savepoint of its own)."""
    event_type = JOB_EVENTS.get(status)  # type: ignore[call-overload]
    if event_type is None:
        return
    try:
        # Most tenants have no endpoint: one indexed read, no transaction (on
        # SQLite a transaction would take the write lock).
        if not _has_endpoint(tenant_id=tenant_id):
            return
        job = Job.objects.filter(pk=job_id).first()  # as the ending wrote it
        if job is not None:
            event_publish(tenant_id=tenant_id, event_type=event_type, data=job_event_data(job))
    except Exception:
        log.exception("could not publish %s for job %s", event_type, job_id)


# Written out: it runs for every job that ends, where the ORM's query cost more
# CPU than the statement.
_HAS_ENDPOINT_SQL = (
    f"SELECT 1 FROM {WebhookEndpoint._meta.db_table} WHERE tenant_id = %s AND enabled = %s LIMIT 1"
)


def _has_endpoint(*, tenant_id: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(_HAS_ENDPOINT_SQL, [tenant_id, True])
        return cursor.fetchone() is not None


def job_event_data(job: Job) -> dict[str, Any]:
    """The job as the event tells it; `audio_url` is added at each attempt."""
    failed = job.status == JobStatus.FAILED
    return {
        "id": str(job.id),
        "status": job.status,
        "error": {"code": job.error_code, "message": job.error_message} if failed else None,
        "characters": job.characters,
        "audio_seconds": job.duration_s,
        "format": job.format,
        "created_at": _iso(job.created_at),
        "finished_at": _iso(job.finished_at),
    }


def batch_event_publish(*, batch: Batch, status: str) -> None:
    """`batch.completed` for a batch that just ended (completed, with failures, or
    cancelled): its counts per item status; the archive link follows on the
    manifest once a light worker built it. Never fails the ending it reports."""
    try:
        [counts] = batch_counts(batches=[batch]).values()
        data = {
            "id": str(batch.id),
            "status": status,
            "item_count": batch.item_count,
            "characters": batch.characters,
            "counts": counts,
            "created_at": _iso(batch.created_at),
            "finished_at": _iso(batch.finished_at),
        }
        event_publish(tenant_id=batch.tenant_id, event_type="batch.completed", data=data)
    except Exception:
        log.exception("could not publish batch.completed for batch %s", batch.id)


def _iso(at: datetime | None) -> str | None:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z") if at else None
