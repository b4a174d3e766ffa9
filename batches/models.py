from __future__ import annotations

import uuid

from django.db import models

from synthesis.models import Job, Priority
from tenants.models import ApiKey, Tenant


class BatchStatus(models.TextChoices):
    RUNNING = "running"
    COMPLETED = "completed"  # every item succeeded
    COMPLETED_WITH_FAILURES = "completed_with_failures"
    # Cancelled: its items are stopped and refunded; a light worker (or the
    # sweeper) ends it within seconds (`batches.cancelling`).
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


class ArchiveStatus(models.TextChoices):
    WAITING = "waiting"  # items still running
    BUILDING = "building"
    READY = "ready"
    FAILED = "failed"
    EXPIRED = "expired"  # deleted with the batch's audio, after the plan's retention


class Batch(models.Model):
    """Many speech jobs submitted together; each item is an ordinary job."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="batches")
    api_key = models.ForeignKey(ApiKey, on_delete=models.SET_NULL, null=True, blank=True)
    status = models.CharField(
        max_length=24, choices=BatchStatus.choices, default=BatchStatus.RUNNING
    )
    priority = models.CharField(max_length=8, choices=Priority.choices, default=Priority.LOW)
    item_count = models.PositiveIntegerField()
    characters = models.PositiveIntegerField()
    archive_status = models.CharField(
        max_length=12, choices=ArchiveStatus.choices, default=ArchiveStatus.WAITING
    )
    archive_key = models.CharField(max_length=255, blank=True, default="")
    archive_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    archive_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The request's `Idempotency-Key` and a hash of its body: the same key and
    # body within 24 hours give this batch again (`batches.services`).
    idempotency_key = models.CharField(max_length=255, blank=True, default="")
    request_fingerprint = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "batches"
        indexes = [
            # A tenant's list, newest first, and its cursor (created_at, id).
            models.Index(fields=["tenant", "-created_at", "-id"], name="batch_tenant_newest"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=~models.Q(idempotency_key=""),
                name="one_batch_per_idempotency_key",
            )
        ]

    def __str__(self) -> str:
        return f"batch {self.id} ({self.status})"


class BatchItem(models.Model):
    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="items")
    index = models.PositiveIntegerField(help_text="Place in the submitted list, from 0.")
    custom_id = models.CharField(max_length=64, blank=True, default="")
    metadata = models.JSONField(default=dict, blank=True)
    job = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="batch_item")

    class Meta:
        ordering = ["batch", "index"]
        constraints = [
            models.UniqueConstraint(fields=["batch", "index"], name="one_item_per_index"),
        ]

    def __str__(self) -> str:
        return f"item {self.index} of {self.batch_id}"
