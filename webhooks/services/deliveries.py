"""Delivering events: one attempt at a time, retried on the schedule, logged.

A delivery is claimed for an attempt with a conditional UPDATE (its attempt
count and status as read), so a duplicated message, the sweeper's republish
and a redelivered task never send one attempt twice. While an attempt runs,
`next_attempt_at` is pushed past its timeouts: a worker that dies mid-attempt
leaves a delivery the sweeper finds due again later.

Short waits (the first retries) ride on the message itself (a Celery countdown,
held by the webhook worker); longer ones are left to the sweeper, which publishes
what is due: a countdown of hours would sit unacknowledged in a worker past the
broker's visibility timeout.

A slow endpoint (an attempt of it took half the attempt's timeout, 5 s, in the
last ten minutes, or has been running that long) has at most
CHORUS_WEBHOOK_ENDPOINT_CONCURRENCY attempts running, and a tenant with a slow
attempt running has at most CHORUS_WEBHOOK_TENANT_CONCURRENCY attempts running
over all its endpoints (20 slow endpoints would otherwise hold 40 threads),
counted at each claim. A delivery that finds its places taken is parked, without
an attempt and without counting as failed: the next of that tenant's attempts to
end publishes its oldest parked delivery whose endpoint has a place
(`_hand_over`), and the sweeper publishes one whose turn never came once its
`next_attempt_at` passes. So receivers that hang for the whole timeout hold that
many webhook-worker threads, not all of them, while one that answers at once is
never held back.
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
from django.db.models import Count, Q, QuerySet, Value
from django.db.models.functions import Coalesce
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
    """Longer than one attempt can take (its deadline, `webhooks.sending`)."""
    return timedelta(seconds=settings.WEBHOOK_TIMEOUT_S + 30)


def deliveries_publish_on_commit(deliveries: Iterable[WebhookDelivery], *, delay_s: float) -> None:
    """Queue the deliveries once the caller's transaction commits: new ones
    (`delay_s` 0) join their endpoint's parked line if it has one, the others go
    to the broker, with `delay_s` as the message's countdown."""
    pairs = [(delivery.id, delivery.endpoint_id) for delivery in deliveries]
    if not pairs or delay_s > COUNTDOWN_MAX_S:
        return
    if delay_s > 0:
        transaction.on_commit(lambda: _publish_all([str(pk) for pk, _ in pairs], delay_s))
    else:
        transaction.on_commit(lambda: _publish_or_park(pairs))


def _publish_or_park(pairs: list[tuple[uuid.UUID, uuid.UUID]]) -> None:
    """A new delivery whose endpoint already has deliveries parked takes its
    place behind them at once, rather than send a message that a worker would
    take only to park it (a burst of a thousand events to one endpoint would
    otherwise cost a thousand such round trips)."""
    publish = []
    for pk, endpoint_id in pairs:
        if not _has_parked(endpoint_id=endpoint_id):
            publish.append(str(pk))
            continue
        now = timezone.now()
        WebhookDelivery.objects.filter(
            pk=pk, status=DeliveryStatus.PENDING, attempts=0, parked_at__isnull=True
        ).update(parked_at=now, next_attempt_at=now + _attempt_lease())
        # As a claim that parks: if the endpoint's attempts all ended meanwhile,
        # nobody is left to hand the line over. (It has a line: it is slow.)
        tenant_id = WebhookEndpoint.objects.values_list("tenant_id", flat=True).get(pk=endpoint_id)
        if not _must_wait(endpoint_id=endpoint_id, tenant_id=tenant_id, now=now, slow=True):
            _hand_over(tenant_id=tenant_id)
    _publish_all(publish, 0)


def _has_parked(*, endpoint_id: uuid.UUID) -> bool:
    return _parked().filter(endpoint_id=endpoint_id).exists()


def _parked() -> QuerySet[WebhookDelivery]:
    """The lines: parked deliveries still pending."""
    return WebhookDelivery.objects.filter(parked_at__isnull=False, status=DeliveryStatus.PENDING)


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
    claim = _claim(delivery=delivery, number=number, now=now)
    if claim != "claimed":
        return {"delivery_id": str(delivery_id), "status": claim}
    endpoint = delivery.endpoint
    if not endpoint.enabled:
        with transaction.atomic():
            WebhookDelivery.objects.filter(pk=delivery.pk, attempts=number).update(
                status=DeliveryStatus.CANCELLED,
                next_attempt_at=None,
                sending_until=None,
                finished_at=now,
                attempts=number - 1,
            )
            _hand_over_on_commit(tenant_id=endpoint.tenant_id)
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


def _claim(*, delivery: WebhookDelivery, number: int, now: datetime) -> str:
    """Take the delivery for attempt `number`: "claimed"; "parked" when its
    endpoint or its tenant is slow and has its most attempts running (`_must_wait`);
    "skipped" when another message took or ended it first (its attempt count or
    status moved)."""
    mine = WebhookDelivery.objects.filter(
        pk=delivery.pk, status=DeliveryStatus.PENDING, attempts=delivery.attempts
    )
    lease = now + _attempt_lease()
    endpoint = delivery.endpoint
    slow = endpoint.slow_until is not None and endpoint.slow_until > now
    if not _must_wait(endpoint_id=endpoint.pk, tenant_id=endpoint.tenant_id, now=now, slow=slow):
        claimed = mine.update(
            attempts=number, next_attempt_at=lease, sending_until=lease, parked_at=None
        )
        return "claimed" if claimed else "skipped"
    # No message of its own until its turn; the sweeper's backstop is
    # `next_attempt_at`, once the running attempts would count as lost.
    if not mine.update(parked_at=Coalesce("parked_at", Value(now)), next_attempt_at=lease):
        return "skipped"
    # An attempt that ended after the look above looked for a parked delivery
    # before this one was parked, and saw none: look again now. Of the two
    # looks, the later sees both changes.
    if not _must_wait(
        endpoint_id=endpoint.pk, tenant_id=endpoint.tenant_id, now=timezone.now(), slow=slow
    ):
        _hand_over(tenant_id=endpoint.tenant_id)
    return "parked"


# An endpoint is held to CHORUS_WEBHOOK_ENDPOINT_CONCURRENCY only while it is
# slow, for SLOW_FOR after an attempt that took half its timeout or more (or
# while one has been running that long). A receiver that answers in time takes as
# many of the webhook workers' threads as are free, and none of its deliveries waits
# a round trip in the line: held to two attempts, a fast receiver's burst cost each
# delivery a second claim (worker CPU per attempt x2), and on a busy host one
# attempt in a thousand took over a second.
SLOW_FOR = timedelta(minutes=10)


def _slow_attempt() -> timedelta:
    return timedelta(seconds=settings.WEBHOOK_TIMEOUT_S / 2)


def _must_wait(*, endpoint_id: uuid.UUID, tenant_id: int, now: datetime, slow: bool) -> bool:
    """Whether the endpoint has its most attempts running (not yet past their
    lease) and is slow: known to be (`slow`), or one of them has run for half the
    timeout (before any slow attempt has ended); or the same of the tenant's
    attempts over all its endpoints, where a running attempt to an endpoint known
    to be slow counts as slow too. One read of the tenant's running attempts (its
    endpoints' index entries). Not under a lock: two claims at once may both pass
    the last place, a bound kept within one, not a limit a receiver relies on."""
    # An attempt's lease ends `_attempt_lease()` after it started.
    long_running = Q(sending_until__lt=now - _slow_attempt() + _attempt_lease())
    mine = Q(endpoint_id=endpoint_id)
    slow_endpoints = WebhookEndpoint.objects.filter(tenant_id=tenant_id, slow_until__gt=now)
    counts = WebhookDelivery.objects.filter(
        endpoint__tenant_id=tenant_id, sending_until__gt=now
    ).aggregate(
        endpoint=Count("pk", filter=mine),
        endpoint_slow=Count("pk", filter=mine & long_running),
        tenant=Count("pk"),
        tenant_slow=Count("pk", filter=long_running | Q(endpoint_id__in=slow_endpoints)),
    )
    if counts["endpoint"] >= settings.WEBHOOK_ENDPOINT_CONCURRENCY and (
        slow or counts["endpoint_slow"]
    ):
        return True
    return counts["tenant"] >= settings.WEBHOOK_TENANT_CONCURRENCY and (
        slow or bool(counts["tenant_slow"])
    )


def _remember_slow(*, endpoint_id: uuid.UUID, outcome: AttemptOutcome, now: datetime) -> None:
    """Mark the endpoint slow for SLOW_FOR after an attempt that took half its
    timeout or more (a timeout included); written at most once per half of it."""
    if outcome.latency_ms < _slow_attempt().total_seconds() * 1000:
        return
    WebhookEndpoint.objects.filter(pk=endpoint_id).filter(
        Q(slow_until__isnull=True) | Q(slow_until__lt=now + SLOW_FOR / 2)
    ).update(slow_until=now + SLOW_FOR)


def _hand_over(*, tenant_id: int) -> None:
    """Publish the tenant's oldest parked delivery whose endpoint has a place
    (fewer than CHORUS_WEBHOOK_ENDPOINT_CONCURRENCY attempts running), due at
    once, if it has one: oldest first over all its endpoints, so one endpoint's
    long line does not keep the others' waiting. Called once an attempt's end is
    committed (its place is free), and by a claim that parked while that end was
    uncommitted. Usually none is parked: one indexed read, no transaction."""
    line = _parked().filter(endpoint__tenant_id=tenant_id)
    if not line.exists():
        return
    while True:
        full = (
            WebhookDelivery.objects.filter(
                endpoint__tenant_id=tenant_id, sending_until__gt=timezone.now()
            )
            .values("endpoint_id")
            .annotate(running=Count("pk"))
            .filter(running__gte=settings.WEBHOOK_ENDPOINT_CONCURRENCY)
            .values("endpoint_id")
        )
        oldest = (
            line.exclude(endpoint_id__in=full)
            .order_by("parked_at")
            .values_list("pk", flat=True)
            .first()
        )
        if oldest is None:
            return
        # Two attempts that end together both read the same oldest: one unparks
        # it, the other goes on to the next (each ended attempt frees a place).
        # If the message is lost, the sweeper publishes the delivery as due.
        # The UPDATE filters the row itself, with no join: a join makes it an
        # `id IN (subquery)`, and PostgreSQL re-checks only the row's own columns
        # after waiting on the other's lock, so both would unpark and publish it.
        if _parked().filter(pk=oldest).update(parked_at=None, next_attempt_at=timezone.now()):
            _publish_all([str(oldest)], 0)
            return


def _hand_over_on_commit(*, tenant_id: int) -> None:
    transaction.on_commit(lambda: _hand_over(tenant_id=tenant_id))


def _record(
    *, delivery: WebhookDelivery, number: int, started_at: datetime, outcome: AttemptOutcome
) -> str:
    with transaction.atomic():
        _remember_slow(endpoint_id=delivery.endpoint_id, outcome=outcome, now=started_at)
        _hand_over_on_commit(tenant_id=delivery.endpoint.tenant_id)
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
            mine.update(
                status=DeliveryStatus.SUCCEEDED,
                next_attempt_at=None,
                sending_until=None,
                finished_at=now,
            )
            return DeliveryStatus.SUCCEEDED
        delay = retry_delay_s(attempts_made=number)
        if delay is None:
            mine.update(
                status=DeliveryStatus.FAILED,
                next_attempt_at=None,
                sending_until=None,
                finished_at=now,
            )
            return DeliveryStatus.FAILED
        mine.update(next_attempt_at=now + timedelta(seconds=delay), sending_until=None)
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
        # Not again every pass while no webhook worker takes them.
        .exclude(republished_at__gt=now - REPUBLISH_EVERY)
        .order_by("next_attempt_at")
        .values_list("id", flat=True)[:limit]
    )
    # A parked one now has a message of its own: no longer the next attempt's to publish.
    WebhookDelivery.objects.filter(pk__in=due).update(republished_at=now, parked_at=None)
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
