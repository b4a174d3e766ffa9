"""The audit trail: one row per security-relevant change, never changed after.

Rows are written in the transaction of the change they record (`audit_record`),
so a change and its event commit or roll back together. On PostgreSQL a trigger
refuses UPDATE, and DELETE unless the retention prune asks for it
(`audit.services.audit_prune`); the admin shows them read-only.
"""

from __future__ import annotations

import uuid

from django.db import models


class EventType(models.TextChoices):
    KEY_CREATED = "api_key.created"
    KEY_REVOKED = "api_key.revoked"
    KEY_UPDATED = "api_key.updated"  # its name, scopes or rate changed
    VOICE_CREATED = "voice.created"
    VOICE_DELETED = "voice.deleted"
    ENDPOINT_CREATED = "webhook_endpoint.created"
    ENDPOINT_UPDATED = "webhook_endpoint.updated"
    ENDPOINT_SECRET_ROTATED = "webhook_endpoint.secret_rotated"
    ENDPOINT_DELETED = "webhook_endpoint.deleted"
    TENANT_CREATED = "tenant.created"
    TENANT_UPDATED = "tenant.updated"  # by an operator: plan, limits, active, name
    PLAN_CREATED = "plan.created"
    PLAN_UPDATED = "plan.updated"


class AuditEvent(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    # Empty for events about no one tenant (a plan changed): the operator's only.
    # PROTECT: tenants are never deleted (they are deactivated), and a cascade
    # would be a DELETE the trigger refuses anyway.
    tenant = models.ForeignKey(
        "tenants.Tenant",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
    )
    type = models.CharField(max_length=64, choices=EventType.choices)
    # "key:<prefix>" for an API key, "staff:<username>" for an operator in the
    # admin, "system" for anything else (a command, the sweeper).
    actor = models.CharField(max_length=200)
    # What changed: "voice:<id>", "api_key:<prefix>", "webhook_endpoint:<id>", ...
    target = models.CharField(max_length=200, blank=True, default="")
    request_id = models.CharField(max_length=64, blank=True, default="")
    source_ip = models.GenericIPAddressField(null=True, blank=True)
    # What changed, as field: [before, after] for changes, or the new values.
    # Never a secret or a key.
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["tenant", "-created_at", "-id"], name="audit_tenant_newest"),
            models.Index(fields=["tenant", "type", "-created_at"], name="audit_tenant_type"),
        ]

    def __str__(self) -> str:
        return f"{self.type} by {self.actor} at {self.created_at:%Y-%m-%d %H:%M:%S}"
