"""One log line and the HTTP metrics per request, and its request id.

The request id is the client's `X-Request-Id` when well formed (short, safe
characters), a new one otherwise; it goes back in the response's `X-Request-Id`,
into every log line of the request, and onto a job the request creates, so the
worker's lines for that job carry it too.

Runs first in the middleware chain, as sync or async code alike (no thread hop
on the streaming views). The duration is to the response's headers: a streamed
body goes on after this line is written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponseBase

from chorus import metrics
from chorus.logs import log_scope, request_id_from

log = logging.getLogger("chorus.request")

# Routes whose error answers are refused speech submissions.
SUBMIT_ROUTES = {"speech-list", "openai-audio-speech"}
# Probes come every few seconds: their lines are kept at DEBUG.
QUIET_ROUTES = {"healthz", "readyz", "metrics"}


class RequestLogMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._acall(request)
        started = time.perf_counter()
        request_id = request_id_from(request.headers.get("X-Request-Id"))
        with log_scope(request_id=request_id) as context:
            metrics.HTTP_IN_PROGRESS.inc()
            try:
                response = self.get_response(request)
            finally:
                metrics.HTTP_IN_PROGRESS.dec()
            return _finish(request, response, started, context)

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        started = time.perf_counter()
        request_id = request_id_from(request.headers.get("X-Request-Id"))
        with log_scope(request_id=request_id) as context:
            metrics.HTTP_IN_PROGRESS.inc()
            try:
                get_response: Callable[[HttpRequest], Awaitable[HttpResponseBase]]
                get_response = self.get_response
                response = await get_response(request)
            finally:
                metrics.HTTP_IN_PROGRESS.dec()
            return _finish(request, response, started, context)


def _finish(
    request: HttpRequest, response: HttpResponseBase, started: float, context: dict[str, Any]
) -> HttpResponseBase:
    seconds = time.perf_counter() - started
    route = _route(request)
    response["X-Request-Id"] = context["request_id"]
    method = request.method or ""
    metrics.observe_request(
        route=route, method=method, status=response.status_code, seconds=seconds
    )
    if route in SUBMIT_ROUTES and method == "POST" and response.status_code >= 400:
        metrics.observe_job_refused(code=context.get("error_code") or str(response.status_code))
    log.log(
        logging.DEBUG if route in QUIET_ROUTES else logging.INFO,
        "%s %s %s %.1f ms",
        method,
        route,
        response.status_code,
        seconds * 1000,
        extra={
            "event": "request",
            "method": method,
            "route": route,
            "status": response.status_code,
            "duration_ms": round(seconds * 1000, 2),
        },
    )
    return response


def _route(request: HttpRequest) -> str:
    """The URL pattern's name: bounded, unlike the path (ids, file keys)."""
    match = getattr(request, "resolver_match", None)
    if match is not None:
        return match.view_name or match.route or "unnamed"
    if request.path.startswith("/" + settings.STATIC_URL.lstrip("/")):
        return "static"
    return "unmatched"
