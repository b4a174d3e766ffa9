"""A slow endpoint has at most CHORUS_WEBHOOK_ENDPOINT_CONCURRENCY attempts
running: a receiver that hangs holds that many light-worker threads, not all of
them. Its other deliveries park, without an attempt, and go out in order as its
attempts end (real PostgreSQL, real receivers on loopback; the queue is a list,
as in test_deliveries.py, and each attempt that must overlap another runs in a
thread of its own, as the light worker's threads do). An endpoint is slow once
one of its attempts has run for half the timeout; here every attempt counts
as slow unless a test says otherwise."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from synthesis.services.sweeper import sweep
from tests.conftest import Persona
from tests.lock_waits import lock_waiters
from tests.webhooks.conftest import Published, endpoint_for
from tests.webhooks.receiver import Receiver, receiver_running
from webhooks.events import event_publish
from webhooks.models import WebhookDelivery
from webhooks.services import deliveries
from webhooks.services.deliveries import delivery_attempt

pytestmark = [pytest.mark.embedded, pytest.mark.django_db(transaction=True)]


SLOW_AS_DEPLOYED = deliveries._slow_attempt


@pytest.fixture(autouse=True)
def every_attempt_slow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deliveries, "_slow_attempt", lambda: timedelta(0))


def events(persona: Persona, count: int, published: Published) -> list[str]:
    """`count` events for the persona's endpoints; their deliveries' ids, taken
    off the queue (the test runs them itself)."""
    for n in range(count):
        event_publish(tenant_id=persona.tenant.pk, event_type="batch.completed", data={"id": n})
    ids = published.ids()
    published.calls.clear()
    return ids


def a_thread(step: Callable[[], dict[str, Any]]) -> tuple[threading.Thread, list[Any]]:
    """A thread (not started) that runs `step` on a connection of its own, and
    the list its result goes to."""
    results: list[Any] = []

    def run() -> None:
        try:
            results.append(step())
        finally:
            connection.close()

    return threading.Thread(target=run, daemon=True), results


def in_a_thread(step: Callable[[], dict[str, Any]]) -> tuple[threading.Thread, list[Any]]:
    thread, results = a_thread(step)
    thread.start()
    return thread, results


def sent_ids(receiver: Receiver) -> list[int]:
    return [json.loads(r.body)["data"]["id"] for r in receiver.received]


def test_deliveries_park_while_the_endpoint_has_its_most_attempts_running_then_go_in_order(
    alice: Persona, receiver: Receiver, published: Published, settings: Any
) -> None:
    settings.WEBHOOK_ENDPOINT_CONCURRENCY = 1
    endpoint_for(alice, receiver)
    first, second, third = events(alice, 3, published)
    receiver.stalls = [1.0]  # the first attempt hangs a while

    slow, slow_result = in_a_thread(lambda: delivery_attempt(delivery_id=first))
    receiver.wait_for(1)
    parked = [delivery_attempt(delivery_id=d) for d in (second, third)]

    assert [r["status"] for r in parked] == ["parked", "parked"]
    assert len(receiver.received) == 1
    assert list(
        WebhookDelivery.objects.filter(pk__in=[second, third]).values_list("attempts", flat=True)
    ) == [0, 0]
    assert published.calls == []  # parked deliveries wait without a message
    # A new event's delivery joins the line at once: no message a worker would
    # take only to park it.
    event_publish(tenant_id=alice.tenant.pk, event_type="batch.completed", data={"id": 3})
    assert published.calls == []
    [fourth] = WebhookDelivery.objects.filter(event__data__id=3).values_list("pk", flat=True)
    assert WebhookDelivery.objects.get(pk=fourth).parked_at is not None

    slow.join(10)
    assert slow_result[0]["status"] == "succeeded"
    # The attempt that ended published the oldest parked delivery, and only it.
    assert published.ids() == [second]
    assert published.run_next()["status"] == "succeeded"
    assert published.ids() == [third]
    assert published.run_next()["status"] == "succeeded"
    assert published.ids() == [str(fourth)]
    assert published.run_next()["status"] == "succeeded"
    assert sent_ids(receiver) == [0, 1, 2, 3]
    assert not WebhookDelivery.objects.filter(parked_at__isnull=False).exists()
    assert not WebhookDelivery.objects.filter(sending_until__isnull=False).exists()


def test_a_hanging_endpoint_does_not_hold_up_another_tenants_deliveries(
    alice: Persona, bob: Persona, receiver: Receiver, published: Published, settings: Any
) -> None:
    settings.WEBHOOK_ENDPOINT_CONCURRENCY = 1
    endpoint_for(alice, receiver)
    [alices, alices_next] = events(alice, 2, published)
    receiver.stalls = [1.0]
    slow, _ = in_a_thread(lambda: delivery_attempt(delivery_id=alices))
    receiver.wait_for(1)

    with receiver_running() as bobs_receiver:
        endpoint_for(bob, bobs_receiver)
        [bobs] = events(bob, 1, published)
        assert delivery_attempt(delivery_id=bobs)["status"] == "succeeded"
        assert delivery_attempt(delivery_id=alices_next)["status"] == "parked"
        assert len(bobs_receiver.received) == 1
    slow.join(10)


def test_two_places_let_two_attempts_run_together(
    alice: Persona, receiver: Receiver, published: Published, settings: Any
) -> None:
    settings.WEBHOOK_ENDPOINT_CONCURRENCY = 2
    endpoint_for(alice, receiver)
    ids = events(alice, 4, published)
    receiver.stalls = [1.0, 1.0]

    threads = [in_a_thread(lambda d=d: delivery_attempt(delivery_id=d))[0] for d in ids[:2]]
    receiver.wait_for(2)
    assert [delivery_attempt(delivery_id=d)["status"] for d in ids[2:]] == ["parked", "parked"]
    for thread in threads:
        thread.join(10)

    # Two attempts ended (about together): each handed its place to one parked
    # delivery, and each parked delivery was published once.
    assert sorted(published.ids()) == sorted(ids[2:])
    assert [r["status"] for r in published.run_all()] == ["succeeded", "succeeded"]


def test_an_attempt_that_ends_while_a_delivery_is_parking_hands_it_its_turn(
    alice: Persona,
    receiver: Receiver,
    published: Published,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The race: a claim counts the endpoint's running attempt, that attempt ends
    and looks for a parked delivery before the claim has parked its own. The
    parked delivery must still get its turn, not wait for the sweeper."""
    settings.WEBHOOK_ENDPOINT_CONCURRENCY = 1
    endpoint_for(alice, receiver)
    running, parking = events(alice, 2, published)
    counted, park = threading.Event(), threading.Event()
    look = deliveries._must_wait
    pausing: list[threading.Thread] = []

    def count_then_pause(**kwargs: Any) -> bool:
        value = look(**kwargs)
        if threading.current_thread() in pausing:
            counted.set()
            assert park.wait(10)
        return value

    monkeypatch.setattr(deliveries, "_must_wait", count_then_pause)
    receiver.stalls = [0.5]
    ending, ended = in_a_thread(lambda: delivery_attempt(delivery_id=running))
    receiver.wait_for(1)
    parker, parked = a_thread(lambda: delivery_attempt(delivery_id=parking))
    pausing.append(parker)
    parker.start()
    assert counted.wait(10)
    # Until the attempt has ended and looked for a parked delivery, or waits to
    # (on SQLite, for the write lock the parking claim holds: a second).
    deadline = timezone.now() + timedelta(seconds=10 if connection.vendor == "postgresql" else 1.5)
    while ending.is_alive() and not lock_waiters() and timezone.now() < deadline:
        threading.Event().wait(0.02)
    park.set()
    parker.join(10)
    ending.join(10)

    assert ended[0]["status"] == "succeeded"
    assert parked[0]["status"] == "parked"
    assert published.ids() == [parking]
    assert published.run_next()["status"] == "succeeded"
    assert sent_ids(receiver) == [0, 1]


def test_an_attempt_past_its_lease_no_longer_takes_a_place(
    alice: Persona,
    receiver: Receiver,
    published: Published,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A light worker that died mid-attempt never ends it: its place frees once
    the attempt would count as lost."""
    settings.WEBHOOK_ENDPOINT_CONCURRENCY = 1
    monkeypatch.setattr(deliveries, "_attempt_lease", lambda: timedelta(seconds=0.3))
    endpoint_for(alice, receiver)
    stuck, after = events(alice, 2, published)
    receiver.stalls = [1.5]
    slow, _ = in_a_thread(lambda: delivery_attempt(delivery_id=stuck))
    receiver.wait_for(1)

    assert delivery_attempt(delivery_id=after)["status"] == "parked"
    WebhookDelivery.objects.filter(pk=after).update(next_attempt_at=timezone.now())
    threading.Event().wait(0.4)  # the stuck attempt's lease passes
    assert delivery_attempt(delivery_id=after)["status"] == "succeeded"
    slow.join(10)


def test_a_parked_delivery_whose_turn_never_came_is_published_by_the_sweeper(
    alice: Persona, receiver: Receiver, published: Published, settings: Any
) -> None:
    settings.WEBHOOK_ENDPOINT_CONCURRENCY = 1
    endpoint_for(alice, receiver)
    running, waiting = events(alice, 2, published)
    # An attempt that is running as far as the database knows (its worker died).
    WebhookDelivery.objects.filter(pk=running).update(
        attempts=1, sending_until=timezone.now() + timedelta(seconds=10)
    )
    assert delivery_attempt(delivery_id=waiting)["status"] == "parked"
    assert sweep().webhooks_published == 0  # its turn may still come

    # Later: the dead attempt's lease and the parked one's wait have passed.
    past = timezone.now() - timedelta(seconds=30)
    WebhookDelivery.objects.filter(pk=running).update(sending_until=past, next_attempt_at=past)
    WebhookDelivery.objects.filter(pk=waiting).update(next_attempt_at=past)
    assert sweep().webhooks_published == 2
    assert sorted(published.ids()) == sorted([running, waiting])
    assert [r["status"] for r in published.run_all()] == ["succeeded", "succeeded"]
    assert len(receiver.received) == 2


def test_an_endpoint_that_answers_at_once_is_not_held_to_the_cap(
    alice: Persona, receiver: Receiver, published: Published, settings: Any, monkeypatch: Any
) -> None:
    # Slow from half the timeout on, as deployed: 1 s here.
    monkeypatch.setattr(deliveries, "_slow_attempt", SLOW_AS_DEPLOYED)
    settings.WEBHOOK_TIMEOUT_S = 2
    settings.WEBHOOK_ENDPOINT_CONCURRENCY = 1
    endpoint_for(alice, receiver)
    first, second = events(alice, 2, published)
    receiver.stalls = [0.5]  # running, but not for a second yet

    running, result = in_a_thread(lambda: delivery_attempt(delivery_id=first))
    receiver.wait_for(1)
    assert delivery_attempt(delivery_id=second)["status"] == "succeeded"
    running.join(10)

    assert result[0]["status"] == "succeeded"
    assert published.calls == []


def test_an_endpoint_that_was_slow_is_held_even_while_its_attempts_are_fresh(
    alice: Persona, receiver: Receiver, published: Published, settings: Any, monkeypatch: Any
) -> None:
    """Else attempts that all start together (a line handed over at once) would
    never be seen running long enough, and a hanging receiver would keep every
    thread it got at first."""
    # Slow from half the timeout on, as deployed: 0.3 s here.
    monkeypatch.setattr(deliveries, "_slow_attempt", SLOW_AS_DEPLOYED)
    settings.WEBHOOK_TIMEOUT_S = 0.6
    settings.WEBHOOK_ENDPOINT_CONCURRENCY = 1
    endpoint = endpoint_for(alice, receiver)
    first, second, third = events(alice, 3, published)
    receiver.stalls = [0.5, 0.5]

    assert delivery_attempt(delivery_id=first)["status"] == "succeeded"  # slow: 0.5 s
    endpoint.refresh_from_db()
    assert endpoint.slow_until is not None
    assert endpoint.slow_until > timezone.now()
    running, _ = in_a_thread(lambda: delivery_attempt(delivery_id=second))
    receiver.wait_for(2)
    assert delivery_attempt(delivery_id=third)["status"] == "parked"  # at once
    running.join(10)
    assert published.ids() == [third]
