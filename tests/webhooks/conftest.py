from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.utils import timezone

from tests.conftest import Persona
from tests.webhooks.receiver import Receiver, receiver_running
from webhooks.models import WebhookDelivery, WebhookEndpoint
from webhooks.services import deliveries
from webhooks.services.deliveries import delivery_attempt, register_publisher
from webhooks.services.endpoints import endpoint_create


@dataclass
class Published:
    """Deliveries handed to the light queue, in order, with their countdown."""

    calls: list[tuple[str, float]] = field(default_factory=list)

    def ids(self) -> list[str]:
        return [delivery_id for delivery_id, _ in self.calls]

    def run_all(self) -> list[dict[str, Any]]:
        """What a light worker does with them, retries included, until none is left:
        one attempt each, as it comes due (the countdown is skipped: the delivery
        is made due now)."""
        results = []
        while self.calls:
            results.append(self.run_next())
        return results

    def run_next(self) -> dict[str, Any]:
        delivery_id, _ = self.calls.pop(0)
        WebhookDelivery.objects.filter(pk=delivery_id, status="pending").update(
            next_attempt_at=timezone.now()
        )
        return delivery_attempt(delivery_id=delivery_id)


@pytest.fixture
def published() -> Iterator[Published]:
    """The queue is replaced by a list here; tests/webhooks/test_light_worker.py
    runs the real one (a light worker process over Redis)."""
    recorder = Published()
    previous = deliveries._publish
    register_publisher(lambda delivery_id, delay_s: recorder.calls.append((delivery_id, delay_s)))
    yield recorder
    deliveries._publish = previous


@pytest.fixture
def receiver(settings: Any) -> Iterator[Receiver]:
    """A receiver on loopback, allowed as an operator would allow it."""
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    with receiver_running() as running:
        yield running


@pytest.fixture
def short_schedule(settings: Any) -> list[float]:
    settings.WEBHOOK_RETRY_SCHEDULE_S = [0.01, 0.01, 0.01]
    settings.WEBHOOK_TIMEOUT_S = 0.5
    return list(settings.WEBHOOK_RETRY_SCHEDULE_S)


def endpoint_for(persona: Persona, receiver: Receiver, **options: Any) -> WebhookEndpoint:
    return endpoint_create(tenant=persona.tenant, url=receiver.url, **options)
