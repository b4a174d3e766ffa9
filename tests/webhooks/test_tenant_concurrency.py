"""A tenant with a slow attempt running has at most CHORUS_WEBHOOK_TENANT_CONCURRENCY
attempts running over all its endpoints: twenty slow endpoints, each within its
own cap of two, would otherwise hold forty webhook-worker threads. Deliveries over
the cap park, without an attempt and without counting as failed, and go out as
the tenant's attempts end, oldest first over all its endpoints; another tenant's
go out at once. (Real PostgreSQL and receivers on loopback; the queue is a list,
as in test_endpoint_concurrency.py, whose helpers this uses.)"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from tests.conftest import Persona
from tests.lock_waits import lock_waiters
from tests.webhooks.conftest import Published
from tests.webhooks.receiver import Receiver, receiver_running
from tests.webhooks.test_endpoint_concurrency import a_thread, events, in_a_thread
from webhooks.models import DeliveryStatus, WebhookAttempt, WebhookDelivery
from webhooks.services import deliveries
from webhooks.services.deliveries import delivery_attempt
from webhooks.services.endpoints import endpoint_create

pytestmark = [pytest.mark.embedded, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def every_attempt_slow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deliveries, "_slow_attempt", lambda: timedelta(0))


def endpoints(persona: Persona, receiver: Receiver, count: int) -> None:
    for n in range(count):
        endpoint_create(tenant=persona.tenant, url=f"{receiver.url}?endpoint={n}")


def test_a_tenants_attempts_over_its_cap_park_over_all_its_endpoints_then_go_in_order(
    alice: Persona, bob: Persona, receiver: Receiver, published: Published, settings: Any
) -> None:
    settings.WEBHOOK_ENDPOINT_CONCURRENCY = 2
    settings.WEBHOOK_TENANT_CONCURRENCY = 2
    endpoints(alice, receiver, 4)  # one event: a delivery to each endpoint
    first, second, third, fourth = events(alice, 1, published)
    receiver.stalls = [1.0, 1.0]

    running = [in_a_thread(lambda d=d: delivery_attempt(delivery_id=d)) for d in (first, second)]
    receiver.wait_for(2)
    # Other endpoints, each with no attempt running: the tenant's cap holds them.
    assert [delivery_attempt(delivery_id=d)["status"] for d in (third, fourth)] == [
        "parked",
        "parked",
    ]
    assert len(receiver.received) == 2
    with receiver_running() as bobs_receiver:
        endpoint_create(tenant=bob.tenant, url=bobs_receiver.url)
        [bobs] = events(bob, 1, published)
        assert delivery_attempt(delivery_id=bobs)["status"] == "succeeded"  # not held
    for thread, _ in running:
        thread.join(10)

    # Each attempt that ended handed its place to one of the tenant's parked
    # deliveries, of whichever endpoint: both went out, neither counted as failed.
    assert sorted(published.ids()) == sorted([third, fourth])
    assert [r["status"] for r in published.run_all()] == ["succeeded", "succeeded"]
    assert len(receiver.received) == 4
    assert set(WebhookDelivery.objects.values_list("status", flat=True)) == {
        DeliveryStatus.SUCCEEDED
    }
    assert WebhookAttempt.objects.filter(succeeded=False).count() == 0
    assert WebhookAttempt.objects.count() == 5  # one each: parking is no attempt


def test_a_tenant_whose_receivers_answer_at_once_is_not_held_to_its_cap(
    alice: Persona, receiver: Receiver, published: Published, settings: Any, monkeypatch: Any
) -> None:
    # Slow from half the timeout on, as deployed: 1 s here.
    monkeypatch.setattr(deliveries, "_slow_attempt", lambda: timedelta(seconds=1))
    settings.WEBHOOK_TENANT_CONCURRENCY = 1
    endpoints(alice, receiver, 2)
    first, second = events(alice, 1, published)
    receiver.stalls = [0.5]  # running, but not for a second yet

    running, result = in_a_thread(lambda: delivery_attempt(delivery_id=first))
    receiver.wait_for(1)
    assert delivery_attempt(delivery_id=second)["status"] == "succeeded"
    running.join(10)

    assert result[0]["status"] == "succeeded"
    assert published.calls == []


def test_two_attempts_that_end_together_hand_their_places_to_two_parked_deliveries(
    alice: Persona, receiver: Receiver, published: Published, settings: Any
) -> None:
    """Both ends read the same oldest parked delivery and both try to unpark it:
    one does, the other goes on to the next. Here both ends wait on the oldest's
    row (another transaction holds it) after reading it, so their UPDATEs meet
    head on; once, a join in that UPDATE let both through, and the oldest went
    out twice while the next stayed parked."""
    settings.WEBHOOK_TENANT_CONCURRENCY = 2
    endpoints(alice, receiver, 2)
    older, newer = events(alice, 1, published)
    now = timezone.now()
    for delivery_id, parked_for in ((older, 2), (newer, 1)):
        WebhookDelivery.objects.filter(pk=delivery_id).update(
            parked_at=now - timedelta(seconds=parked_for), next_attempt_at=now
        )
    held, release = threading.Event(), threading.Event()

    def hold_the_oldest() -> dict[str, Any]:
        with transaction.atomic():
            WebhookDelivery.objects.select_for_update().filter(pk=older).get()
            held.set()
            assert release.wait(10)
        return {}

    def an_attempt_ends() -> dict[str, Any]:
        deliveries._hand_over(tenant_id=alice.tenant.pk)
        return {}

    holder, _ = in_a_thread(hold_the_oldest)
    assert held.wait(10)
    ends = [a_thread(an_attempt_ends)[0] for _ in range(2)]
    for end in ends:
        end.start()
    # Until both wait on the row (on SQLite, which has no row locks and runs one
    # writer at a time, a moment: there they cannot meet head on).
    deadline = timezone.now() + timedelta(seconds=10 if connection.vendor == "postgresql" else 0.3)
    while lock_waiters() < 2 and timezone.now() < deadline:
        threading.Event().wait(0.02)
    release.set()
    holder.join(10)
    for end in ends:
        end.join(10)

    assert sorted(published.ids()) == sorted([older, newer])
    assert not WebhookDelivery.objects.filter(parked_at__isnull=False).exists()
