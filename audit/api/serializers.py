from __future__ import annotations

from rest_framework import serializers

from audit.models import AuditEvent, EventType
from chorus.api.serializers import ModelOutput


class AuditEventOutput(ModelOutput):
    type = serializers.ChoiceField(choices=EventType.choices)  # type: ignore[assignment]

    class Meta:
        model = AuditEvent
        fields = ["id", "created_at", "type", "actor", "target", "request_id", "source_ip", "data"]
        read_only_fields = fields


class AuditEventPage(serializers.Serializer):
    next = serializers.URLField(
        allow_null=True, help_text="The next (older) page; null at the end."
    )
    previous = serializers.URLField(
        allow_null=True, help_text="The previous (newer) page; null on the first."
    )
    results = AuditEventOutput(many=True)
