"""Calibrated device profiles, and which limits each worker chose and why.

An app of its own (tables `calibration_*`): its rows describe cards, not jobs,
and its migrations never wait on the job tables'.
"""

from __future__ import annotations

from django.db import models


class ProfileStatus(models.TextChoices):
    CALIBRATING = "calibrating"  # `owner` measures it now, until `deadline`
    READY = "ready"
    FAILED = "failed"  # the next worker of this card tries again


class CalibratedProfile(models.Model):
    """One card + engine + model + flags + versions (`identity.profile_key`) and
    the curve measured on it, in the JSON form `CHORUS_DEVICE_PROFILE` files use."""

    key = models.CharField(max_length=64, primary_key=True, help_text="sha256 of `parts`.")
    engine = models.CharField(max_length=32)
    card = models.CharField(max_length=200)
    parts = models.JSONField(
        help_text="What keys it: card, memory, engine, model, flags, versions."
    )
    status = models.CharField(max_length=12, choices=ProfileStatus.choices)
    owner = models.CharField(max_length=200, blank=True, default="", help_text="host:pid")
    deadline = models.DateTimeField(null=True, blank=True)
    document = models.JSONField(null=True, blank=True, help_text="The profile.")
    limits = models.CharField(
        max_length=32, blank=True, default="", help_text="low,normal,high when it was measured."
    )
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    calibrated_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.engine} on {self.card} ({self.key[:12]})"


class WorkerLimits(models.Model):
    """The stream limits a worker process chose at start and why; one row per
    worker, beside its heartbeat row (same name), written once."""

    worker = models.CharField(max_length=200, primary_key=True)
    low = models.PositiveIntegerField()
    normal = models.PositiveIntegerField()
    high = models.PositiveIntegerField()
    source = models.CharField(
        max_length=32, help_text="calibrated, stored, profile, by hand or engine."
    )
    profile_name = models.CharField(max_length=200, blank=True, default="")
    profile = models.ForeignKey(
        CalibratedProfile,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        db_constraint=False,  # a deleted profile must not fail a live worker's write
        related_name="+",
    )
    chosen_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.worker}: {self.low},{self.normal},{self.high} ({self.source})"
