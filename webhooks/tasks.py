"""Celery tasks of the webhooks app: interfaces only, on the `webhooks` queue (its own
workers: `synthesis.worker.light_worker_argv`)."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.conf import settings

from webhooks.services.deliveries import delivery_attempt, register_publisher


@shared_task(name="webhooks.deliver")
def deliver_webhook_task(delivery_id: str) -> dict[str, Any]:
    return delivery_attempt(delivery_id=delivery_id)


def _publish(delivery_id: str, delay_s: float) -> None:
    if delay_s > 0:
        deliver_webhook_task.apply_async(
            (delivery_id,), queue=settings.WEBHOOK_QUEUE, countdown=delay_s
        )
    else:
        deliver_webhook_task.apply_async((delivery_id,), queue=settings.WEBHOOK_QUEUE)


register_publisher(_publish)
