"""What the API reference says about errors and the headers around every answer.

An operation lists the errors it can answer (`error_responses(*TENANT_ERRORS, ...)`);
each status becomes one documented response in the error envelope whose
description names its codes and whose examples show each code's envelope, so the
docs page tells a client every status and code it has to handle. An `ErrorDoc`
made from an error class (`ErrorDoc.of`) takes its status and code from the
class, so the reference cannot drift from what the code raises.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse
from rest_framework import serializers

from chorus.errors import ChorusError, InvalidInput, NotFound, UnknownField
from quotas.errors import InsufficientScope, RateLimited


class ErrorBody(serializers.Serializer):
    code = serializers.CharField(help_text="Stable and machine-readable: branch on this.")
    message = serializers.CharField(help_text="For people: what happened and what to do.")
    details = serializers.DictField(
        help_text="Facts about this error (the limit, the value, the fields); may be empty."
    )


# Only for the schema (a docstring here would show in it): the answers themselves
# are built by `chorus.api.errors.envelope`.
class ErrorEnvelope(serializers.Serializer):
    error = ErrorBody()


@dataclass(frozen=True)
class ErrorDoc:
    status: int
    code: str
    meaning: str
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, error: type[ChorusError], meaning: str, **details: Any) -> ErrorDoc:
        return cls(error.status, error.code, meaning, details)


def error_responses(*errors: ErrorDoc) -> dict[int, OpenApiResponse]:
    by_status: dict[int, list[ErrorDoc]] = {}
    for error in errors:
        same = by_status.setdefault(error.status, [])
        assert error.code not in {e.code for e in same}, f"{error.code} listed twice"
        same.append(error)
    return {
        status: OpenApiResponse(
            ErrorEnvelope,
            description="\n".join(f"- `{e.code}`: {e.meaning}" for e in listed),
            examples=[
                OpenApiExample(
                    e.code,
                    value={"error": {"code": e.code, "message": e.meaning, "details": e.details}},
                )
                for e in listed
            ],
        )
        for status, listed in sorted(by_status.items())
    }


# --- answered by every route that takes an API key ----------------------------------

UNAUTHENTICATED = ErrorDoc(401, "unauthenticated", "No `Authorization: Bearer ck_...` header.")
INVALID_API_KEY = ErrorDoc(401, "invalid_api_key", "The API key is unknown or revoked.")
INVALID_AUTHORIZATION = ErrorDoc(
    401, "invalid_authorization", "The Authorization header is not `Bearer <api key>`."
)
TENANT_INACTIVE = ErrorDoc(
    403, "tenant_inactive", "This tenant is disabled; contact the operator of this service."
)
INSUFFICIENT_SCOPE = ErrorDoc.of(
    InsufficientScope,
    "The API key lacks the scope this route needs (`read` for reads, `audit:read` for the "
    "audit trail, `voices:write` or `speech:write` for changes).",
    required="speech:write",
    granted=["read"],
)
RATE_LIMITED = ErrorDoc.of(
    RateLimited,
    "Too many requests this minute for this account or API key; retry after `Retry-After` seconds.",
    limit=60,
    window_seconds=60,
    scope="tenant",
)
SERVICE_BUSY = ErrorDoc(
    503,
    "service_busy",
    "Chorus has too many requests in progress to take this one; nothing was done. "
    "Retry after `Retry-After` seconds.",
)
TENANT_ERRORS = (
    UNAUTHENTICATED,
    INVALID_API_KEY,
    INVALID_AUTHORIZATION,
    TENANT_INACTIVE,
    INSUFFICIENT_SCOPE,
    RATE_LIMITED,
    SERVICE_BUSY,
)

# --- reading a request ----------------------------------------------------------------

INVALID_REQUEST = ErrorDoc.of(
    InvalidInput,
    "A field is missing or not valid; `details.fields` says which and why.",
    fields={"text": ["This field is required."]},
)
UNKNOWN_FIELD = ErrorDoc.of(
    UnknownField,
    "The body has a field this route does not take (a typo?); `details.fields` names it.",
    fields=["fromat"],
)
MALFORMED_REQUEST = ErrorDoc(400, "malformed_request", "The body could not be parsed.")
UNSUPPORTED_MEDIA_TYPE = ErrorDoc(
    415, "unsupported_media_type", "The body's Content-Type is not the one this route takes."
)


def not_found(what: str, **details: Any) -> ErrorDoc:
    return ErrorDoc.of(
        NotFound,
        f"No {what} with this id among yours (another tenant's ids are not found either).",
        **details,
    )


def response_headers(*success: int) -> list[OpenApiParameter]:
    """The rate-limit headers of an answer that passed the limiter, and Retry-After."""
    rate = [
        ("X-RateLimit-Limit", "Requests allowed per minute (the tighter of account and key)."),
        ("X-RateLimit-Remaining", "Requests left in the current minute."),
        ("X-RateLimit-Reset", "Seconds until the window has room again."),
    ]
    return [
        *(
            OpenApiParameter(
                name, int, OpenApiParameter.HEADER, description=text, response=list(success)
            )
            for name, text in rate
        ),
        OpenApiParameter(
            "Retry-After",
            int,
            OpenApiParameter.HEADER,
            description="Seconds to wait before retrying.",
            response=[429, 503],
        ),
    ]
