"""ASGI middleware: refuse oversized bodies before Django reads them.

Django's ASGI handler reads the whole body before any view runs, so a view's own
Content-Length check comes too late to save bandwidth and disk. Here a declared
length over the caller's plan limit (voice uploads) or over the service-wide
ceiling (every other request, whatever its method) is answered 413 at once, and
a body that arrives without a length is cut off when it passes the ceiling.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections

from chorus.api.errors import envelope

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_UPLOAD_PATHS = ("/v1/voices",)


class BodyLimitMiddleware:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        ceiling = int(settings.MAX_REQUEST_BYTES)
        declared = _int(headers.get(b"content-length"))
        if declared is not None:
            limit = ceiling
            if scope["method"] == "POST" and scope["path"].rstrip("/") in _UPLOAD_PATHS:
                limit = min(ceiling, await _plan_upload_limit(headers.get(b"authorization")))
            if declared > limit:
                await _refuse(send, limit, declared)
                return
            await self.app(scope, receive, send)
            return
        await self._counted(scope, receive, send, ceiling)

    async def _counted(self, scope: Scope, receive: Receive, send: Send, ceiling: int) -> None:
        received = 0
        cut_off = False
        started = False

        async def counting_receive() -> Message:
            nonlocal received, cut_off
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > ceiling:
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
            await _refuse(send, ceiling, received)


def _int(raw: bytes | None) -> int | None:
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


@sync_to_async
def _plan_upload_limit(authorization: bytes | None) -> int:
    """The caller's plan limit plus multipart framing; the ceiling if the key is
    unknown (authentication then answers 401 without this layer guessing)."""
    from quotas.plans import tenant_limits
    from synthesis.uploads import MULTIPART_OVERHEAD_BYTES
    from tenants.services import api_key_authenticate

    # Outside Django's request cycle nothing else replaces a dead connection.
    close_old_connections()
    try:
        parts = (authorization or b"").split()
        if len(parts) == 2 and parts[0].lower() == b"bearer":
            key = api_key_authenticate(raw=parts[1].decode(errors="replace"))
            if key is not None:
                return tenant_limits(key.tenant).max_upload_bytes + MULTIPART_OVERHEAD_BYTES
    except Exception:  # the view checks again; never fail the request here
        log.warning("could not look up the upload limit", exc_info=True)
    finally:
        close_old_connections()
    return int(settings.MAX_REQUEST_BYTES)


async def _refuse(send: Send, limit: int, size: int) -> None:
    body = json.dumps(
        envelope(
            "file_too_large",
            f"The request body is larger than the limit of {limit} bytes.",
            {"limit_bytes": limit, "size_bytes": size},
        )
    ).encode()
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
