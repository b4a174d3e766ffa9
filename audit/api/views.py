from __future__ import annotations

from datetime import datetime

from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from audit.api.serializers import AuditEventOutput, AuditEventPage
from audit.models import EventType
from audit.selectors import audit_event_list
from chorus.api.openapi import INVALID_REQUEST, TENANT_ERRORS, error_responses, response_headers
from chorus.api.pagination import paginate
from chorus.api.views import TenantAPIView
from chorus.errors import InvalidInput

# Audit events name who did what from where: a key of their own, not `read`.
AUDIT_SCOPE = "audit:read"

_PARAMETERS = [
    OpenApiParameter(
        "type",
        str,
        OpenApiParameter.QUERY,
        required=False,
        description="Only events of this type; repeat it or separate types with commas.",
        enum=EventType.values,
    ),
    OpenApiParameter(
        "since",
        str,
        OpenApiParameter.QUERY,
        required=False,
        description="ISO 8601 date-time with an offset: events at or after it.",
    ),
    OpenApiParameter(
        "until",
        str,
        OpenApiParameter.QUERY,
        required=False,
        description="ISO 8601 date-time with an offset: events before it.",
    ),
    OpenApiParameter("limit", int, OpenApiParameter.QUERY, required=False),
    OpenApiParameter("cursor", str, OpenApiParameter.QUERY, required=False),
]

DESCRIPTION = (
    "Your account's audit trail, newest first: API keys created, revoked or changed, "
    "voices created and deleted, webhook endpoints created, changed or given a new "
    "secret, and changes an operator made to your account. Each event names its actor "
    "(`key:<prefix>` or `staff:<user>`), the request id and the source address. "
    "Needs the `audit:read` scope."
)


class AuditEventListView(TenantAPIView):
    read_scope = AUDIT_SCOPE

    @extend_schema(
        operation_id="audit_events_list",
        tags=["audit"],
        summary="List your account's audit events",
        description=DESCRIPTION,
        parameters=[*_PARAMETERS, *response_headers(200)],
        responses={200: AuditEventPage, **error_responses(*TENANT_ERRORS, INVALID_REQUEST)},
    )
    def get(self, request: Request) -> Response:
        events = audit_event_list(
            tenant_id=self.tenant.pk,
            types=_types(request),
            since=_instant(request, "since"),
            until=_instant(request, "until"),
        )
        page = paginate(request, events)
        return Response(page.body(AuditEventOutput(page.rows, many=True).data))


def _types(request: Request) -> list[str]:
    types = [t for raw in request.query_params.getlist("type") for t in raw.split(",") if t]
    unknown = sorted(set(types) - set(EventType.values))
    if unknown:
        raise InvalidInput(
            f"Unknown event type: {', '.join(unknown)}.",
            details={"field": "type", "unknown": unknown, "known": list(EventType.values)},
        )
    return types


def _instant(request: Request, name: str) -> datetime | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        at = parse_datetime(raw)
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise InvalidInput(
            f"'{name}' is an ISO 8601 date-time with an offset, e.g. 2026-01-31T12:00:00Z.",
            details={"field": name, "value": raw},
        )
    return at
