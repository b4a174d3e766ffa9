from __future__ import annotations

from drf_spectacular.utils import extend_schema, extend_schema_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from chorus.api.openapi import TENANT_ERRORS, error_responses, response_headers
from chorus.api.views import TenantAPIView
from quotas.selectors import usage_summary


@extend_schema_serializer(component_name="UsagePeriod")
class _Period(serializers.Serializer):
    starts_at = serializers.DateTimeField()
    ends_at = serializers.DateTimeField()


@extend_schema_serializer(component_name="UsageCharacters")
class _Characters(serializers.Serializer):
    used = serializers.IntegerField()
    reserved = serializers.IntegerField(help_text="Held by queued and running jobs.")
    limit = serializers.IntegerField()
    remaining = serializers.IntegerField()
    resets_at = serializers.DateTimeField()


@extend_schema_serializer(component_name="UsageCount")
class _Count(serializers.Serializer):
    used = serializers.IntegerField()
    limit = serializers.IntegerField()


@extend_schema_serializer(component_name="UsageJobs")
class _Jobs(serializers.Serializer):
    pending = serializers.IntegerField(
        help_text="Admitted and held back until one of your queue slots frees (fair admission)."
    )
    queued = serializers.IntegerField()
    running = serializers.IntegerField()
    succeeded = serializers.IntegerField()
    failed = serializers.IntegerField()
    cancelled = serializers.IntegerField()


class UsageOutput(serializers.Serializer):
    period = _Period()
    characters = _Characters()
    jobs = _Jobs(
        help_text="Jobs waiting or running now, and jobs of this period that ended, by status."
    )
    audio_seconds = serializers.FloatField(help_text="Audio generated this period.")
    voices = _Count()
    storage_bytes = _Count()


class UsageView(TenantAPIView):
    @extend_schema(
        operation_id="usage_retrieve",
        summary="Your usage this billing period",
        description="Characters used, reserved by queued and running jobs, and left of "
        "your plan's monthly limit, with when they reset; this period's jobs by status and "
        "seconds of audio; voices and storage against your plan. Needs the `read` scope.",
        parameters=response_headers(200),
        responses={200: UsageOutput, **error_responses(*TENANT_ERRORS)},
    )
    def get(self, request: Request) -> Response:
        return Response(UsageOutput(usage_summary(tenant=self.tenant)).data)
