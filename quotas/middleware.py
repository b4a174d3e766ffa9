"""The ASGI middleware that holds request bodies to their route's limit
(`quotas.body_limits`) before Django reads them: a declared length over it is
answered 413 unread, and a body without one is cut off once it passes it."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from chorus.api.errors import envelope
from quotas.body_limits import (
    BodyLimit,
    BodyTooLarge,
    ceiling,
    declared_length,
    plan_route,
    service_body_limit,
)
from tenants.authentication import (
    AuthenticationError,
    TenantDisabled,
    api_key_from_credentials_async,
)
from tenants.models import Tenant

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BodyLimitMiddleware:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        limit = service_body_limit()
        route = plan_route(scope["method"], scope["path"])
        if route is not None:
            # An unknown key keeps the ceiling: authentication answers 401 then.
            tenant = await _caller(headers.get(b"authorization"))
            if tenant is not None:
                limit = ceiling(route(tenant))
        declared = declared_length(headers.get(b"content-length"))
        if declared is not None:
            if declared > limit.max_bytes:
                await _refuse(send, BodyTooLarge(limit=limit, size=declared))
                return
            await self.app(scope, receive, send)
            return
        await self._counted(scope, receive, send, limit)

    async def _counted(self, scope: Scope, receive: Receive, send: Send, limit: BodyLimit) -> None:
        received = 0
        cut_off = False
        started = False

        async def counting_receive() -> Message:
            nonlocal received, cut_off
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit.max_bytes:
                    cut_off = True
                    # Django treats a disconnect as an aborted request and stops reading.
                    return {"type": "http.disconnect"}
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counting_receive, tracking_send)
        if cut_off and not started:
            await _refuse(send, BodyTooLarge(limit=limit, size=received))


async def _caller(authorization: bytes | None) -> Tenant | None:
    """The tenant whose plan sizes the body, or None (the ceiling holds)."""
    try:
        return (await api_key_from_credentials_async(authorization=authorization)).tenant
    except TenantDisabled as disabled:  # the view answers 403; the plan still sizes the body
        return disabled.api_key.tenant
    except AuthenticationError:
        return None
    except Exception:  # the view checks again; never fail the request here
        log.warning("could not look up the caller's body limit", exc_info=True)
        return None


async def _refuse(send: Send, error: BodyTooLarge) -> None:
    body = json.dumps(envelope(error.code, error.message, error.details)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
