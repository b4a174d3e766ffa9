"""Delivering events: one attempt at a time, retried on the schedule, logged.

A delivery is claimed for an attempt with a conditional UPDATE (its attempt
count and status as read), so a duplicated message, the sweeper's republish
and a redelivered task never send one attempt twice. While an attempt runs,
`next_attempt_at` is pushed past its timeouts: a worker that dies mid-attempt
leaves a delivery the sweeper finds due again later.

Short waits (the first retries) ride on the message itself (a Celery countdown,
held by the light worker); longer ones are left to the sweeper, which publishes
what is due: a countdown of hours would sit unacknowledged in a worker past the
broker's visibility timeout.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from chorus.sealing import SealBroken
from synthesis.models import Job
from synthesis.services.jobs import job_download_url
from tenants.models import Tenant
from webhooks.errors import WebhookEndpointDisabled
from webhooks.models import (
    DeliveryStatus,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
)
from webhooks.schedule import retry_delay_s
from webhooks.sending import AttemptOutcome, webhook_send
from webhooks.signing import signed_headers

log = logging.getLogger("chorus.webhooks")

# Waits up to this long are a countdown on the message; longer ones the sweeper's.
COUNTDOWN_MAX_S = 60.0
# A due delivery still pending this long after its time lost its message.
LOST_GRACE = timedelta(seconds=10)
# A countdown may fire a little early by the clock of the database.
EARLY_TOLERANCE = timedelta(seconds=1)
SWEEP_BATCH = 500
REPUBLISH_EVERY = timedelta(minutes=2)

# Set by webhooks.tasks: this layer must not import the task module.
_publish: Callable[[str, float], None] | None = None


def register_publisher(publish: Callable[[str, float], None]) -> None:
    global _publish
    _publish = publish


def _attempt_lease() -> timedelta:
    """Longer than one attempt can take."""
    worst = settings.WEBHOOK_CONNECT_TIMEOUT_S + 2 * settings.WEBHOOK_READ_TIMEOUT_S
    return timedelta(seconds=worst + 30)


def deliveries_publish_on_commit(deliveries: Iterable[WebhookDelivery], *, delay_s: float) -> None:
    ids = [str(delivery.id) for delivery in deliveries]
    if ids and delay_s <= COUNTDOWN_MAX_S:
        transaction.on_commit(lambda: _publish_all(ids, delay_s))


def _publish_all(ids: list[str], delay_s: float) -> None:
    assert _publish is not None, "webhooks.tasks registers it when the app is ready"
    for delivery_id in ids:
        try:
            _publish(delivery_id, delay_s)
        except Exception:  # broker down: the sweeper publishes it once Redis is back
            log.warning("could not publish webhook delivery %s", delivery_id, exc_info=True)


def delivery_attempt(*, delivery_id: uuid.UUID | str) -> dict[str, Any]:
    """Make the delivery's next attempt, if it is due and still wanted."""
    now = timezone.now()
    delivery = (
        WebhookDelivery.objects.select_related("event", "endpoint")
        .filter(pk=delivery_id, status=DeliveryStatus.PENDING)
        .first()
    )
    if delivery is None:
        return {"delivery_id": str(delivery_id), "status": "skipped"}
    if delivery.next_attempt_at and delivery.next_attempt_at > now + EARLY_TOLERANCE:
        return {"delivery_id": str(delivery_id), "status": "not_due"}
    number = delivery.attempts + 1
    claimed = WebhookDelivery.objects.filter(
        pk=delivery.pk, status=DeliveryStatus.PENDING, attempts=delivery.attempts
    ).update(attempts=number, next_attempt_at=now + _attempt_lease())
    if not claimed:
        return {"delivery_id": str(delivery_id), "status": "skipped"}
    endpoint = delivery.endpoint
    if not endpoint.enabled:
        WebhookDelivery.objects.filter(pk=delivery.pk, attempts=number).update(
            status=DeliveryStatus.CANCELLED,
            next_attempt_at=None,
            finished_at=now,
            attempts=number - 1,
        )
        return {"delivery_id": str(delivery_id), "status": DeliveryStatus.CANCELLED}
    body = json.dumps(event_payload(delivery.event), separators=(",", ":"))
    try:
        secret = endpoint.secret
    except SealBroken as exc:
        # The service's key changed without the old one kept as a fallback: an
        # attempt that failed here (retried on schedule), never an unsigned send.
        outcome = AttemptOutcome(succeeded=False, latency_ms=0.0, error=f"secret {exc}")
    else:
        headers = signed_headers(
            secret=secret, webhook_id=delivery.event.webhook_id, body=body, at=now
        )
        outcome = webhook_send(url=endpoint.url, body=body.encode(), headers=headers)
    status = _record(delivery=delivery, number=number, started_at=now, outcome=outcome)
    log.info(
        "webhook %s attempt %d to endpoint %s: %s",
        delivery.event.webhook_id,
        number,
        endpoint.id,
        outcome.response_status or outcome.error,
        extra={
            "event": "webhook",
            "tenant_id": endpoint.tenant_id,
            "delivery_id": str(delivery.id),
            "attempt": number,
            "status": status,
            "latency_ms": outcome.latency_ms,
        },
    )
    return {"delivery_id": str(delivery_id), "status": status, "attempt": number}


def _record(
    *, delivery: WebhookDelivery, number: int, started_at: datetime, outcome: AttemptOutcome
) -> str:
    with transaction.atomic():
        WebhookAttempt.objects.create(
            delivery=delivery,
            number=number,
            started_at=started_at,
            latency_ms=outcome.latency_ms,
            response_status=outcome.response_status,
            response_body=outcome.response_body,
            error=outcome.error[:500],
            succeeded=outcome.succeeded,
        )
        mine = WebhookDelivery.objects.filter(pk=delivery.pk, attempts=number)
        now = timezone.now()
        if outcome.succeeded:
            mine.update(status=DeliveryStatus.SUCCEEDED, next_attempt_at=None, finished_at=now)
            return DeliveryStatus.SUCCEEDED
        delay = retry_delay_s(attempts_made=number)
        if delay is None:
            mine.update(status=DeliveryStatus.FAILED, next_attempt_at=None, finished_at=now)
            return DeliveryStatus.FAILED
        mine.update(next_attempt_at=now + timedelta(seconds=delay))
        deliveries_publish_on_commit([delivery], delay_s=delay)
        return "retrying"


def event_payload(event: WebhookEvent) -> dict[str, Any]:
    """The body of every attempt: `{"type", "timestamp", "data"}`. A succeeded
    job's download link is signed afresh for each attempt, so a retry hours
    later still carries a link that works."""
    data = dict(event.data)
    if event.type == "speech.succeeded":
        job = (
            Job.objects.select_related("tenant")
            .filter(pk=str(data.get("id")), tenant_id=event.tenant_id)
            .first()
        )
        link = job_download_url(job=job) if job is not None else None
        data["audio_url"] = link[0] if link else None
        data["audio_url_expires_at"] = _iso(link[1]) if link else None
    return {"type": event.type, "timestamp": _iso(event.created_at), "data": data}


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def delivery_redeliver(
    *, tenant: Tenant, endpoint: WebhookEndpoint, delivery: WebhookDelivery
) -> WebhookDelivery:
    """Send the delivery's event again, as a new delivery with a fresh schedule
    and the same `webhook-id` (a receiver that has it already can drop it)."""
    assert endpoint.tenant_id == tenant.pk
    assert delivery.endpoint_id == endpoint.pk
    if not endpoint.enabled:
        raise WebhookEndpointDisabled(
            "The endpoint is disabled; enable it to receive deliveries.",
            details={"endpoint_id": str(endpoint.id)},
        )
    with transaction.atomic():
        again = WebhookDelivery.objects.create(
            event_id=delivery.event_id, endpoint=endpoint, next_attempt_at=timezone.now()
        )
        deliveries_publish_on_commit([again], delay_s=0)
    return again


def deliveries_publish_due(*, limit: int = SWEEP_BATCH) -> int:
    """For the sweeper: publish deliveries that are due and have no message
    (a wait longer than a countdown, a message lost with the broker, a worker
    that died mid-attempt). Oldest first, at most `limit` a pass."""
    now = timezone.now()
    due = list(
        WebhookDelivery.objects.filter(
            status=DeliveryStatus.PENDING, next_attempt_at__lte=now - LOST_GRACE
        )
        # Not again every pass while no light worker takes them.
        .exclude(republished_at__gt=now - REPUBLISH_EVERY)
        .order_by("next_attempt_at")
        .values_list("id", flat=True)[:limit]
    )
    WebhookDelivery.objects.filter(pk__in=due).update(republished_at=now)
    _publish_all([str(delivery_id) for delivery_id in due], 0)
    return len(due)


def events_forget(*, limit: int = SWEEP_BATCH) -> int:
    """For the sweeper: delete events older than the retention whose deliveries
    have all ended (with their deliveries and logs), oldest first, `limit` a pass."""
    before = timezone.now() - timedelta(days=settings.WEBHOOK_RETENTION_DAYS)
    old = list(
        WebhookEvent.objects.filter(created_at__lt=before)
        .exclude(deliveries__status=DeliveryStatus.PENDING)
        .order_by("created_at")
        .values_list("id", flat=True)[:limit]
    )
    if old:
        WebhookEvent.objects.filter(pk__in=old).delete()
    return len(old)
