"""Request body limits, per route and from the caller's plan, held twice: by the
ASGI middleware before Django reads a body, and by `body_limit_check` in the API
views once the caller is known (the Django test client and any WSGI server skip
the middleware; chunked bodies reach the views with their length filled in).

A route whose body carries what a plan limits gets a limit large enough for the
largest request that plan allows, and past it the code of that plan limit:
- `POST /v1/speech` and `POST /v1/audio/speech`: the plan's longest text (its
  long-form limit, else its one-job limit), `longform_text_too_long` (or
  `text_too_long` on a plan without long-form);
- `POST /v1/batches`: the plan's batch (items, characters in all, each item's
  other fields at their largest), `batch_too_large`;
- `POST /v1/voices`: the plan's upload size plus multipart framing, `file_too_large`.
Every other API body is held to `DEFAULT_BODY_BYTES`; any body, whatever the
plan, to `settings.MAX_REQUEST_BYTES` (the service's ceiling). Each answer is
413, before the body is read.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections

from chorus.api.errors import envelope
from chorus.errors import ChorusError
from quotas.plans import tenant_batch_limits, tenant_limits
from synthesis.uploads import MULTIPART_OVERHEAD_BYTES
from tenants.key_cache import key_cache_get
from tenants.keys import hash_key, looks_like_key
from tenants.models import Tenant
from tenants.services import api_key_authenticate

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# A character of text is at most 6 bytes of JSON: a `\uXXXX` escape, which is how
# encoders writing ASCII (Python's json by default) send any non-ASCII character.
JSON_BYTES_PER_CHAR = 6
# A speech request but its text, every field at its largest: an instruction of 500
# characters (3,000 bytes escaped), a voice id, the field names, whitespace.
SPEECH_FIELDS_BYTES = 4 * 1024
# A batch item but its text: metadata (2,048 bytes as JSON), an instruction (3,000
# bytes escaped), custom_id and id (64 characters each), the other fields, and room
# for indentation. An enterprise batch at its largest stays under the 64 MiB ceiling.
BATCH_ITEM_FIELDS_BYTES = 7 * 1024
# Any other API body (a webhook endpoint, a cancel): JSON of a few fields.
DEFAULT_BODY_BYTES = 1024 * 1024


@dataclass(frozen=True)
class BodyLimit:
    limit_bytes: int  # what the error reports
    code: str  # the error code past it
    what: str  # what the limit bounds, for the message
    framing_bytes: int = 0  # allowed on top and not reported (multipart framing)

    @property
    def max_bytes(self) -> int:
        return self.limit_bytes + self.framing_bytes


class BodyTooLarge(ChorusError):
    """A body over its route's limit; the code names the limit (see the module)."""

    status = 413

    def __init__(self, *, limit: BodyLimit, size: int) -> None:
        super().__init__(
            f"The request body is {size} bytes; {limit.what} allows at most "
            f"{limit.limit_bytes} bytes.",
            details={"limit_bytes": limit.limit_bytes, "size_bytes": size},
        )
        self.code = limit.code


def _service() -> BodyLimit:
    return BodyLimit(int(settings.MAX_REQUEST_BYTES), "file_too_large", "this service")


def _ceiling(limit: BodyLimit) -> BodyLimit:
    """`limit`, or the service's ceiling where that is lower (with `limit`'s code)."""
    ceiling = int(settings.MAX_REQUEST_BYTES)
    if limit.max_bytes <= ceiling:
        return limit
    return BodyLimit(limit_bytes=ceiling, code=limit.code, what="this service")


def _speech(tenant: Tenant) -> BodyLimit:
    limits = tenant_limits(tenant)
    longform = limits.max_longform_chars > limits.max_text_chars
    chars = max(limits.max_text_chars, limits.max_longform_chars)
    return BodyLimit(
        limit_bytes=chars * JSON_BYTES_PER_CHAR + SPEECH_FIELDS_BYTES,
        code="longform_text_too_long" if longform else "text_too_long",
        what=f"your plan's longest text ({chars} characters)",
    )


def _batch(tenant: Tenant) -> BodyLimit:
    limits, batch = tenant_limits(tenant), tenant_batch_limits(tenant)
    chars = min(batch.max_items * limits.max_text_chars, batch.max_characters)
    return BodyLimit(
        limit_bytes=chars * JSON_BYTES_PER_CHAR
        + batch.max_items * BATCH_ITEM_FIELDS_BYTES
        + SPEECH_FIELDS_BYTES,
        code="batch_too_large",
        what=f"your plan's largest batch ({batch.max_items} items, {chars} characters)",
    )


def _upload(tenant: Tenant) -> BodyLimit:
    return BodyLimit(
        limit_bytes=tenant_limits(tenant).max_upload_bytes,
        code="file_too_large",
        what="your plan's upload size",
        framing_bytes=MULTIPART_OVERHEAD_BYTES,
    )


# POST routes whose body is bounded by the caller's plan.
_PLAN_ROUTES: dict[str, Callable[[Tenant], BodyLimit]] = {
    "/v1/speech": _speech,
    "/v1/audio/speech": _speech,
    "/v1/batches": _batch,
    "/v1/voices": _upload,
    "/v1/provenance/verify": _upload,
}


def _plan_route(method: str, path: str) -> Callable[[Tenant], BodyLimit] | None:
    return _PLAN_ROUTES.get(path.rstrip("/")) if method == "POST" else None


def body_limit_for(*, method: str, path: str, tenant: Tenant) -> BodyLimit:
    """The limit on a body `tenant` sends to `method path`."""
    route = _plan_route(method, path)
    if route is not None:
        return _ceiling(route(tenant))
    return _ceiling(BodyLimit(DEFAULT_BODY_BYTES, "file_too_large", "this endpoint"))


def body_limit_check(*, method: str, path: str, content_length: str | None, tenant: Tenant) -> None:
    """Refuse a declared length over the route's limit, before the body is read.
    A body without one was cut off at the ceiling by the middleware, and Django's
    ASGI handler then declares its length (`chorus.asgi_handler`)."""
    declared = _int(content_length)
    if declared is None:
        return
    limit = body_limit_for(method=method, path=path, tenant=tenant)
    if declared > limit.max_bytes:
        raise BodyTooLarge(limit=limit, size=declared)


class BodyLimitMiddleware:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        limit = _service()
        route = _plan_route(scope["method"], scope["path"])
        if route is not None:
            # An unknown key keeps the ceiling: authentication answers 401 then.
            tenant = await _caller(headers.get(b"authorization"))
            if tenant is not None:
                limit = _ceiling(route(tenant))
        declared = _int(headers.get(b"content-length"))
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


def _int(raw: bytes | str | None) -> int | None:
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


async def _caller(authorization: bytes | None) -> Tenant | None:
    """The tenant of a Bearer key, or None. A key this process has checked lately
    is found in memory (`tenants.key_cache`) without leaving the event loop."""
    parts = (authorization or b"").split()
    if len(parts) != 2 or parts[0].lower() != b"bearer":
        return None
    raw = parts[1].decode(errors="replace")
    if not looks_like_key(raw):
        return None
    cached = key_cache_get(hash_key(raw))
    if cached is not None:
        return cached.tenant
    return await _look_up(raw)


@sync_to_async
def _look_up(raw: str) -> Tenant | None:
    # Outside Django's request cycle nothing else replaces a dead connection.
    close_old_connections()
    try:
        key = api_key_authenticate(raw=raw)
        return key.tenant if key is not None else None
    except Exception:  # the view checks again; never fail the request here
        log.warning("could not look up the caller's body limit", exc_info=True)
        return None
    finally:
        close_old_connections()


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
