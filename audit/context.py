"""Who made a change, and from where, for the audit trail.

The middleware keeps the request being answered in a context variable; an
event recorded while it is answered takes its actor from the request's user as
it is by then: the API key that DRF authenticated (a `TenantPrincipal`, which
sets `request.user`), or the staff user of the admin. Outside a request (a
management command, the sweeper) the actor is "system".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponseBase

from chorus.logs import log_field

_request: ContextVar[HttpRequest | None] = ContextVar("audit_request", default=None)

SYSTEM = "system"


@dataclass(frozen=True)
class Origin:
    actor: str
    request_id: str
    source_ip: str | None


def current_origin() -> Origin:
    request = _request.get()
    request_id = str(log_field("request_id") or "")
    if request is None:
        return Origin(actor=SYSTEM, request_id=request_id, source_ip=None)
    return Origin(
        actor=_actor(request),
        request_id=request_id,
        source_ip=request.META.get("REMOTE_ADDR") or None,
    )


def _actor(request: HttpRequest) -> str:
    # By now DRF's authentication has put the key's principal on the request
    # (`Request.user` sets it on the HttpRequest too); the admin's is its user.
    user: Any = getattr(request, "user", None)
    api_key = getattr(user, "api_key", None)
    if api_key is not None:
        return f"key:{api_key.prefix}"
    if user is not None and getattr(user, "is_authenticated", False):
        return f"staff:{user.get_username()}"
    return SYSTEM


class AuditContextMiddleware:
    """After AuthenticationMiddleware: the request, for events recorded while it runs."""

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
        token = _request.set(request)
        try:
            return self.get_response(request)
        finally:
            _request.reset(token)

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        token = _request.set(request)
        try:
            get_response: Callable[[HttpRequest], Awaitable[HttpResponseBase]]
            get_response = self.get_response
            return await get_response(request)
        finally:
            _request.reset(token)
