from __future__ import annotations

from datetime import UTC, date, datetime, time

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from chorus.api.openapi import INVALID_REQUEST, TENANT_ERRORS, error_responses, response_headers
from chorus.api.views import TenantAPIView
from chorus.errors import InvalidInput
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


PERIOD = OpenApiParameter(
    "period",
    date,
    OpenApiParameter.QUERY,
    description="A day (`YYYY-MM-DD`, UTC, from 1970-01-01 to today) in the billing period "
    "to report; this period when absent. Past periods keep their totals after their jobs "
    "are pruned.",
)


EARLIEST_PERIOD_DAY = date(1970, 1, 1)


def _period_day(raw: str | None) -> datetime | None:
    """The start of the asked-for day, or None for the current period."""
    if raw is None:
        return None
    try:
        day = date.fromisoformat(raw)
    except ValueError:
        raise InvalidInput(
            "`period` must be a day as YYYY-MM-DD.", details={"fields": {"period": [raw]}}
        ) from None
    if day > timezone.now().date():
        raise InvalidInput(
            "`period` is in the future; usage is known up to today.",
            details={"fields": {"period": [raw]}},
        )
    if day < EARLIEST_PERIOD_DAY:
        # Nothing was used before it, and year 1's periods would begin in year 0.
        raise InvalidInput(
            f"`period` is before {EARLIEST_PERIOD_DAY}; usage is known from then on.",
            details={"fields": {"period": [raw]}},
        )
    return datetime.combine(day, time.min, tzinfo=UTC)


class UsageView(TenantAPIView):
    @extend_schema(
        operation_id="usage_retrieve",
        summary="Your usage this billing period, or a past one",
        description="Characters used, reserved by queued and running jobs, and left of "
        "your plan's monthly limit, with when they reset; the period's jobs by status and "
        "seconds of audio; voices and storage (as they are now) against your plan. "
        "`?period=YYYY-MM-DD` reports the period containing that day: its totals stay after "
        "its jobs are pruned, and jobs pending, queued and running are counted only for the "
        "current period. Needs the `read` scope.",
        parameters=[PERIOD, *response_headers(200)],
        responses={200: UsageOutput, **error_responses(INVALID_REQUEST, *TENANT_ERRORS)},
    )
    def get(self, request: Request) -> Response:
        at = _period_day(request.query_params.get("period"))
        return Response(UsageOutput(usage_summary(tenant=self.tenant, at=at)).data)
