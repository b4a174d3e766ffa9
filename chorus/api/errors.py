"""One exception handler, one envelope: {"error": {"code", "message", "details"}}."""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

from django.core.exceptions import PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import OperationalError
from django.http import Http404, HttpRequest, JsonResponse
from django.urls import Resolver404, resolve
from rest_framework import exceptions
from rest_framework.response import Response

from chorus.errors import ChorusError
from chorus.logs import log_bind

log = logging.getLogger(__name__)

# DRF's built-in exceptions get codes of our own vocabulary.
_DRF_CODES: dict[type[exceptions.APIException], str] = {
    exceptions.NotAuthenticated: "unauthenticated",
    exceptions.AuthenticationFailed: "unauthenticated",
    exceptions.PermissionDenied: "permission_denied",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.ParseError: "malformed_request",
    exceptions.ValidationError: "invalid_request",
    exceptions.Throttled: "rate_limited",
}


def envelope(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    log_bind(error_code=code)  # every error answer passes here: its request's line says why
    return {"error": {"code": code, "message": message, "details": details or {}}}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ChorusError):
        return Response(
            envelope(exc.code, exc.message, exc.details), status=exc.status, headers=exc.headers
        )
    if database_busy(exc):
        return Response(
            envelope(
                "service_busy",
                "Chorus has too many requests in progress to take this one; nothing was done. "
                "Retry in a moment.",
            ),
            status=503,
            headers={"Retry-After": "1"},
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    elif isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(exc.messages)
    if not isinstance(exc, exceptions.APIException):
        return None  # a bug: let Django log it and answer 500 (see handler500)

    headers: dict[str, str] = {}
    if getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = exc.auth_header  # type: ignore[attr-defined]
    if getattr(exc, "wait", None):
        headers["Retry-After"] = str(int(exc.wait))  # type: ignore[attr-defined]

    code = _code_for(exc)
    if isinstance(exc, exceptions.ValidationError):
        message = "The request is not valid; see details for each field."
        details = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        return Response(
            envelope(code, message, {"fields": details}), exc.status_code, headers=headers
        )
    if isinstance(exc, exceptions.UnsupportedMediaType):
        return _unsupported_media_type(exc, context, headers)
    return Response(envelope(code, str(exc.detail)), exc.status_code, headers=headers)


def _unsupported_media_type(
    exc: exceptions.UnsupportedMediaType, context: dict[str, Any], headers: dict[str, str]
) -> Response:
    """DRF names only what was sent; say what to send (`curl -d` sends a form)."""
    request = context.get("request")
    taken = [parser.media_type for parser in getattr(request, "parsers", None) or []]
    message = str(exc.detail)
    if taken:
        message += f" This route takes: {', '.join(taken)}."
    details = {"content_types": taken}
    return Response(
        envelope("unsupported_media_type", message, details), exc.status_code, headers=headers
    )


def database_busy(exc: BaseException) -> bool:
    """The database could not take the request in time: every pooled PostgreSQL
    connection stayed in use for the pool's timeout, or SQLite's write lock stayed
    taken for its busy timeout. Either way the transaction did nothing."""
    if not isinstance(exc, OperationalError):
        return False
    if isinstance(exc.__cause__, sqlite3.OperationalError):
        # The only OperationalErrors SQLite raises for contention; others are bugs.
        return str(exc.__cause__) in _SQLITE_BUSY
    from psycopg_pool import PoolTimeout  # only installed with PostgreSQL support

    return isinstance(exc.__cause__, PoolTimeout)


_SQLITE_BUSY = {"database is locked", "database table is locked"}


def _code_for(exc: exceptions.APIException) -> str:
    if isinstance(exc, exceptions.AuthenticationFailed):
        # Our authentication raises with codes of its own (invalid_api_key, ...).
        code = getattr(exc.detail, "code", None)
        return code if code and code != "authentication_failed" else "unauthenticated"
    own = getattr(exc, "default_code", "")
    if isinstance(exc, exceptions.PermissionDenied) and own not in {"permission_denied", ""}:
        return str(own)  # a subclass with its own code, e.g. tenant_inactive
    for cls in type(exc).__mro__:
        if cls in _DRF_CODES:
            return _DRF_CODES[cls]
    return own or "error"


def json_400(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return JsonResponse(
        envelope(
            "bad_request",
            "The request could not be read (too large, too many parts, "
            "or a host this service does not answer to).",
        ),
        status=400,
    )


def json_403(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return JsonResponse(envelope("permission_denied", "Forbidden."), status=403)


def json_404(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    path = request.path
    if path.endswith("/") and path != "/" and _routed(path.rstrip("/")):
        # `POST /v1/speech/`: Django's "Not found." left the caller guessing why.
        route = path.rstrip("/")
        return JsonResponse(
            envelope("not_found", f"No route {path}; the route is {route}.", {"route": route}),
            status=404,
        )
    return JsonResponse(envelope("not_found", "Not found."), status=404)


def _routed(path: str) -> bool:
    try:
        resolve(path)
    except Resolver404:
        return False
    return True


def json_500(request: HttpRequest) -> JsonResponse:
    return JsonResponse(
        envelope("internal_error", "Something went wrong on our side; it has been logged."),
        status=500,
    )
