"""`POST /v1/realtime/tokens`: a client token for a browser's realtime session
(`synthesis.realtime.tokens`). The session itself is a WebSocket, served beside
Django (`synthesis.realtime.endpoint`)."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from chorus.api.openapi import (
    INVALID_REQUEST,
    MALFORMED_REQUEST,
    TENANT_ERRORS,
    UNKNOWN_FIELD,
    UNSUPPORTED_MEDIA_TYPE,
    ErrorDoc,
    error_responses,
    response_headers,
)
from chorus.api.serializers import StrictInput
from chorus.api.views import TenantAPIView
from chorus.redis_client import get_redis
from synthesis.realtime.endpoint import PATH
from synthesis.realtime.tokens import DEFAULT_TTL_S, MAX_TTL_S, token_create
from synthesis.services.jobs import QueueUnavailable


class RealtimeTokenInput(StrictInput):
    expires_in = serializers.IntegerField(
        min_value=1,
        max_value=MAX_TTL_S,
        default=DEFAULT_TTL_S,
        help_text=f"Seconds the token may wait to be used (at most {MAX_TTL_S}).",
    )


class RealtimeTokenOutput(serializers.Serializer):
    token = serializers.CharField(help_text="Connect with ?token=<token>; it works once.")
    expires_at = serializers.DateTimeField()
    url = serializers.CharField(help_text="The session's WebSocket URL with the token.")


TOKEN_ERRORS = (
    *TENANT_ERRORS,
    INVALID_REQUEST,
    UNKNOWN_FIELD,
    MALFORMED_REQUEST,
    UNSUPPORTED_MEDIA_TYPE,
    ErrorDoc.of(
        QueueUnavailable,
        "Redis, where tokens and sessions live, is unreachable; no token was made.",
    ),
)


class RealtimeTokenView(TenantAPIView):
    write_scope = "speech:write"

    @extend_schema(
        operation_id="realtime_token_create",
        summary="Make a client token for a browser's realtime session",
        description=(
            "A browser's WebSocket cannot send an `Authorization` header. Make a token "
            "here with a key that has `speech:write`, hand it to the page, and connect to "
            f"`{PATH}?token=<token>`. A token works once, for this tenant, and expires "
            f"after `expires_in` seconds (at most {MAX_TTL_S}). The protocol: "
            "docs/api/realtime.md."
        ),
        request=RealtimeTokenInput,
        examples=[
            OpenApiExample(
                "A token for a page",
                summary="A token the page uses within a minute",
                value={"expires_in": 60},
                request_only=True,
            )
        ],
        parameters=response_headers(201),
        responses={201: RealtimeTokenOutput, **error_responses(*TOKEN_ERRORS)},
    )
    def post(self, request: Request) -> Response:
        serializer = RealtimeTokenInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        client = get_redis()
        if client is None:
            raise QueueUnavailable("Realtime sessions need Redis; it is not configured here.")
        token, expires_at = token_create(
            client=client, api_key=self.api_key, ttl_s=serializer.validated_data["expires_in"]
        )
        base = settings.PUBLIC_URL.replace("http", "ws", 1)
        return Response(
            {"token": token, "expires_at": expires_at, "url": f"{base}{PATH}?token={token}"},
            status=status.HTTP_201_CREATED,
        )
