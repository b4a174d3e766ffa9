"""Webhook endpoints, the events sent to them, each delivery and its attempts.

An event is one message (its id is the `webhook-id` header, the same on every
attempt and redelivery, so receivers can dedupe); a delivery is that event on
its way to one endpoint; an attempt is one HTTP request of a delivery.
"""

from __future__ import annotations

import uuid

from django.db import models

from chorus.sealing import seal, unseal
from tenants.models import Tenant

EVENT_TYPES = ("speech.succeeded", "speech.failed", "batch.completed")


class WebhookEndpoint(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="webhook_endpoints")
    url = models.URLField(max_length=2000)
    # Needed in the clear to sign every delivery, so sealed (chorus.sealing), not
    # hashed; shown to the tenant only when created or rotated.
    secret_sealed = models.TextField()
    event_types = models.JSONField(default=list, help_text=f"Any of {', '.join(EVENT_TYPES)}.")
    enabled = models.BooleanField(default=True)
    description = models.CharField(max_length=500, blank=True, default="")
    # Until when its attempts are held to CHORUS_WEBHOOK_ENDPOINT_CONCURRENCY: set
    # by a slow attempt (`webhooks.services.deliveries`).
    slow_until = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [models.Index(fields=["tenant", "created_at"], name="webhook_endpoint_tenant")]

    def __str__(self) -> str:
        return self.url

    @property
    def secret(self) -> str:
        """The signing secret (`whsec_...`); SealBroken if no configured key opens it."""
        return unseal(self.secret_sealed)

    @secret.setter
    def secret(self, value: str) -> None:
        self.secret_sealed = seal(value)


class WebhookEvent(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="webhook_events")
    type = models.CharField(max_length=64)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # The sweeper's look for events past retention, oldest first.
        indexes = [models.Index(fields=["created_at"], name="webhook_event_created")]

    def __str__(self) -> str:
        return f"{self.type} {self.webhook_id}"

    @property
    def webhook_id(self) -> str:
        return f"msg_{self.id.hex}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # every attempt of the schedule failed
    CANCELLED = "cancelled"  # the endpoint was disabled before it went out


class WebhookDelivery(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    event = models.ForeignKey(WebhookEvent, on_delete=models.CASCADE, related_name="deliveries")
    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries"
    )
    status = models.CharField(
        max_length=12, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    # When the next attempt may start; while one runs, when it counts as lost.
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    # When the sweeper last published it (see `deliveries_publish_due`).
    republished_at = models.DateTimeField(null=True, blank=True)
    # While an attempt runs: when it counts as lost. Such attempts are counted
    # against the endpoint's CHORUS_WEBHOOK_ENDPOINT_CONCURRENCY.
    sending_until = models.DateTimeField(null=True, blank=True)
    # Since when it waits for one of its endpoint's running attempts to end (the
    # endpoint had its most running); the first to end publishes the oldest.
    parked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "webhook deliveries"
        indexes = [
            models.Index(fields=["endpoint", "created_at"], name="webhook_delivery_endpoint"),
            # The sweeper's look for deliveries whose message was lost.
            models.Index(
                fields=["next_attempt_at"],
                name="webhook_delivery_due",
                condition=models.Q(status="pending"),
            ),
            # An endpoint's running attempts, counted at every claim.
            models.Index(
                fields=["endpoint", "sending_until"],
                name="webhook_delivery_sending",
                condition=models.Q(sending_until__isnull=False),
            ),
            # An endpoint's parked deliveries, oldest first.
            models.Index(
                fields=["endpoint", "parked_at"],
                name="webhook_delivery_parked",
                condition=models.Q(parked_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event.type} → {self.endpoint.url} ({self.status})"


class WebhookAttempt(models.Model):
    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE, related_name="log")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    latency_ms = models.FloatField(null=True, blank=True)
    response_status = models.PositiveIntegerField(null=True, blank=True)
    response_body = models.TextField(blank=True, default="")  # the first KiB
    error = models.CharField(max_length=500, blank=True, default="")
    succeeded = models.BooleanField(default=False)

    class Meta:
        ordering = ["delivery", "number"]
        constraints = [
            models.UniqueConstraint(fields=["delivery", "number"], name="webhook_attempt_once")
        ]

    def __str__(self) -> str:
        return f"attempt {self.number}: {self.response_status or self.error}"
