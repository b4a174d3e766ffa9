from __future__ import annotations

from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers

from chorus.api.serializers import ModelOutput, StrictInput
from webhooks.models import EVENT_TYPES, WebhookAttempt, WebhookDelivery, WebhookEndpoint

_EVENT_TYPES_HELP = f"Events to receive, any of {', '.join(EVENT_TYPES)}; all when omitted."


@extend_schema_serializer(component_name="WebhookEndpointCreate")
class EndpointCreateInput(StrictInput):
    url = serializers.CharField(
        max_length=2000,
        help_text="https:// (or http://) URL that takes a POST; it must resolve to a public "
        "address unless the operator allows private ones.",
    )
    # Checked by the service (`unknown_event_type`), not here, so the code is one.
    event_types = serializers.ListField(
        child=serializers.CharField(max_length=64), required=False, help_text=_EVENT_TYPES_HELP
    )
    enabled = serializers.BooleanField(required=False, default=True)
    description = serializers.CharField(
        max_length=500, required=False, allow_blank=True, default=""
    )


@extend_schema_serializer(component_name="WebhookEndpointUpdate")
class EndpointUpdateInput(StrictInput):
    url = serializers.CharField(max_length=2000, required=False)
    event_types = serializers.ListField(
        child=serializers.CharField(max_length=64), required=False, help_text=_EVENT_TYPES_HELP
    )
    enabled = serializers.BooleanField(
        required=False, help_text="A disabled endpoint receives nothing, retries included."
    )
    description = serializers.CharField(max_length=500, required=False, allow_blank=True)


class EndpointOutput(ModelOutput):
    class Meta:
        model = WebhookEndpoint
        fields = ["id", "url", "event_types", "enabled", "description", "created_at", "updated_at"]
        read_only_fields = fields


class EndpointWithSecretOutput(EndpointOutput):
    secret = serializers.CharField(
        help_text="`whsec_...`: verify deliveries with it. Shown only now; rotate to get a new one."
    )

    class Meta(EndpointOutput.Meta):
        fields = [*EndpointOutput.Meta.fields, "secret"]
        read_only_fields = fields


class EndpointList(serializers.Serializer):
    results = EndpointOutput(many=True)


class AttemptOutput(ModelOutput):
    class Meta:
        model = WebhookAttempt
        fields = [
            "number",
            "started_at",
            "latency_ms",
            "response_status",
            "response_body",
            "error",
            "succeeded",
        ]
        read_only_fields = fields


class DeliveryOutput(ModelOutput):
    webhook_id = serializers.CharField(
        source="event.webhook_id",
        help_text="The `webhook-id` header: the same on every attempt and redelivery.",
    )
    event_type = serializers.CharField(source="event.type")
    log = AttemptOutput(many=True, help_text="Every attempt, first to last.")

    class Meta:
        model = WebhookDelivery
        fields = [
            "id",
            "webhook_id",
            "event_type",
            "status",
            "attempts",
            "next_attempt_at",
            "created_at",
            "finished_at",
            "log",
        ]
        read_only_fields = fields


class DeliveryPage(serializers.Serializer):
    next = serializers.URLField(allow_null=True, help_text="The next (older) page.")
    previous = serializers.URLField(allow_null=True, help_text="The previous (newer) page.")
    results = DeliveryOutput(many=True)
