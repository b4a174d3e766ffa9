from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

PRIORITIES = ("high", "normal", "low")


# What a key may do: upload and delete voices, submit speech, read everything
# but the audit trail, read the audit trail (who did what from where).
SCOPES = ("voices:write", "speech:write", "read", "audit:read")


def _all_priorities() -> list[str]:
    return list(PRIORITIES)


def _all_scopes() -> list[str]:
    return list(SCOPES)


def validate_priorities(value: object) -> None:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(item, str) and item in PRIORITIES for item in value)
    ):
        raise ValidationError(f"Use a non-empty list of {', '.join(PRIORITIES)}.")


# The plan's fields that are a tenant's limits (`quotas.plans.Limits`): what its
# `limit_overrides` may replace.
LIMIT_NAMES = (
    "monthly_characters",
    "max_text_chars",
    "max_longform_chars",
    "requests_per_minute",
    "max_concurrent_jobs",
    "voice_slots",
    "max_upload_bytes",
    "min_reference_seconds",
    "max_reference_seconds",
    "allowed_priorities",
    "link_ttl_seconds",
    "output_retention_days",
    "storage_bytes",
)


# Not a plan's limit: {"provenance": false} lets a tenant's audio go unsigned,
# and only where the operator allows it (CHORUS_C2PA_REQUIRED=false; synthesis.provenance).
SWITCH_PROVENANCE = "provenance"


def validate_overrides(overrides: Any) -> None:
    """Refuse overrides the admin could mistype: unknown names, wrong types, negatives."""
    if not isinstance(overrides, dict):
        raise ValidationError("Overrides must be a JSON object.")
    for name, value in overrides.items():
        if name == SWITCH_PROVENANCE:
            if not isinstance(value, bool):
                raise ValidationError(f"{name} must be true or false.")
            continue
        if name not in LIMIT_NAMES:
            known = ", ".join((*LIMIT_NAMES, SWITCH_PROVENANCE))
            raise ValidationError(f"Unknown limit {name!r}; use one of {known}.")
        if name == "allowed_priorities":
            # Items are checked one by one: set() of a list holding lists or
            # objects would raise TypeError (a 500 in the admin) instead. Empty is
            # refused as on the plan: it would refuse every submission.
            if not isinstance(value, list) or not value or any(p not in PRIORITIES for p in value):
                raise ValidationError(
                    f"allowed_priorities must be a non-empty list of {PRIORITIES}."
                )
        elif isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValidationError(f"{name} must be a non-negative number.")


class Plan(models.Model):
    """The limits a tenant buys. Defaults are the Free tier's."""

    name = models.CharField(max_length=64, unique=True)
    max_text_chars = models.PositiveIntegerField(
        default=300, help_text="Longest text accepted in one speech job (characters)."
    )
    max_longform_chars = models.PositiveIntegerField(
        default=0,
        help_text="Longest text accepted as a long-form job, split into segments "
        "(characters); 0 or at most max_text_chars means no long-form.",
    )
    max_upload_bytes = models.PositiveBigIntegerField(
        default=15 * 1024 * 1024, help_text="Largest reference recording accepted (bytes)."
    )
    min_reference_seconds = models.FloatField(default=3.0)
    max_reference_seconds = models.FloatField(default=30.0)
    allowed_priorities = models.JSONField(
        default=_all_priorities,
        validators=[validate_priorities],
        help_text='A list of any of "high", "normal", "low".',
    )
    link_ttl_seconds = models.PositiveIntegerField(
        default=3600,
        # S3 presigned links cannot live longer than 7 days.
        validators=[MinValueValidator(1), MaxValueValidator(7 * 24 * 3600)],
        help_text="Lifetime of signed download links (seconds, at most 7 days).",
    )
    monthly_characters = models.PositiveBigIntegerField(
        default=100_000, help_text="Characters of text synthesized per billing month."
    )
    requests_per_minute = models.PositiveIntegerField(
        default=60, help_text="API requests per minute, per tenant and per key."
    )
    max_concurrent_jobs = models.PositiveIntegerField(
        default=4, help_text="Speech jobs queued or running at once."
    )
    voice_slots = models.PositiveIntegerField(default=5, help_text="Voices kept at once.")
    output_retention_days = models.PositiveIntegerField(
        default=7, help_text="Days generated audio is kept before it is deleted."
    )
    storage_bytes = models.PositiveBigIntegerField(
        default=1024**3, help_text="Bytes of voices and generated audio kept at once."
    )
    # Defaults are the Free tier's (`quotas.plans.tenant_batch_limits`).
    batch_max_items = models.PositiveIntegerField(
        default=100, validators=[MinValueValidator(1)], help_text="Items in one batch."
    )
    batch_max_characters = models.PositiveBigIntegerField(
        default=20_000,
        validators=[MinValueValidator(1)],
        help_text="Characters of all of a batch's items together.",
    )
    # Realtime sessions (`synthesis.realtime`): a WebSocket that takes text as it
    # is written. Defaults are the Free tier's.
    max_realtime_sessions = models.PositiveIntegerField(
        default=1, help_text="Realtime sessions open at once (0: none)."
    )
    max_session_seconds = models.PositiveIntegerField(
        default=600,
        validators=[MinValueValidator(1)],
        help_text="Longest a realtime session may stay open (seconds).",
    )
    max_session_characters = models.PositiveIntegerField(
        default=5_000,
        validators=[MinValueValidator(1)],
        help_text="Characters of text one realtime session may send.",
    )
    realtime_idle_timeout_s = models.PositiveIntegerField(
        default=20,
        validators=[MinValueValidator(1)],
        help_text="A realtime session with no text for this long is closed (seconds).",
    )
    require_voice_consent = models.BooleanField(
        default=False,
        help_text="New voices need a consent record (the speaker, how and when they agreed).",
    )
    audit_retention_days = models.PositiveIntegerField(
        default=365,
        validators=[MinValueValidator(1)],
        help_text="Days the audit trail is kept before the sweeper deletes it.",
    )

    def __str__(self) -> str:
        return self.name


class Tenant(models.Model):
    # Lowercase letters, digits and dashes only: the slug names the tenant's
    # bucket, and S3 bucket names allow nothing else.
    slug = models.CharField(
        max_length=40,
        unique=True,
        validators=[
            RegexValidator(
                r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$",
                "Use lowercase letters, digits and dashes (not at either end).",
            )
        ],
    )
    name = models.CharField(max_length=200)
    active = models.BooleanField(default=True)
    plan = models.ForeignKey(Plan, on_delete=models.PROTECT, related_name="tenants")
    bucket = models.CharField(max_length=63, unique=True, editable=False)
    limit_overrides = models.JSONField(
        default=dict,
        blank=True,
        help_text='Per-tenant limits that replace the plan\'s, e.g. {"monthly_characters": '
        "500000}. Keys are plan field names.",
    )
    billing_anchor = models.DateField(
        null=True, blank=True, help_text="Monthly periods start on this day of the month."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.slug

    def clean(self) -> None:
        try:
            validate_overrides(self.limit_overrides)
        except ValidationError as exc:
            raise ValidationError({"limit_overrides": exc.messages}) from None


class ApiKey(models.Model):
    """A tenant's API key. Only a SHA-256 hash is stored; the key is shown once."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, default="default")
    prefix = models.CharField(max_length=12, unique=True, editable=False)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)
    requests_per_minute = models.PositiveIntegerField(
        null=True, blank=True, help_text="This key's own limit; empty means the plan's."
    )
    scopes = models.JSONField(default=_all_scopes, help_text=f"Any of {', '.join(SCOPES)}.")

    class Meta:
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"ck_{self.prefix}… ({self.name})"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    def clean(self) -> None:
        if not isinstance(self.scopes, list) or not set(self.scopes) <= set(SCOPES):
            raise ValidationError({"scopes": f"Use a list of {', '.join(SCOPES)}."})
