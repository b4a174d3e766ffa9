"""How large a request body and an upload may be, per route and from the caller's
plan: the one place the numbers come from. Each is held where it can be:
- a declared Content-Length, by the ASGI middleware (`quotas.middleware`) before
  Django reads a body, and by `body_limit_check` in the API views once the caller
  is known (the Django test client and any WSGI server skip the middleware;
  chunked bodies reach the views with their length filled in);
- a body without one, counted by the middleware as it streams in;
- an uploaded file's own bytes, counted as they are parsed
  (`synthesis.uploads.upload_limit` with `upload_limit_bytes`), and its decoded
  audio by the voice service (`synthesis.audio.decode_reference`).

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

from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings

from chorus.errors import ChorusError
from quotas.plans import tenant_batch_limits, tenant_limits
from tenants.models import Tenant

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
# Multipart framing (boundaries, part headers, the small text fields) on top of
# an uploaded file itself.
MULTIPART_OVERHEAD_BYTES = 64 * 1024


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


def service_body_limit() -> BodyLimit:
    """Any body, whoever sends it: the service's ceiling."""
    return BodyLimit(int(settings.MAX_REQUEST_BYTES), "file_too_large", "this service")


def ceiling(limit: BodyLimit) -> BodyLimit:
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


def upload_limit_bytes(tenant: Tenant) -> int:
    """The largest file `tenant` may upload (a voice, a file to verify)."""
    return tenant_limits(tenant).max_upload_bytes


def _upload(tenant: Tenant) -> BodyLimit:
    return BodyLimit(
        limit_bytes=upload_limit_bytes(tenant),
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


def plan_route(method: str, path: str) -> Callable[[Tenant], BodyLimit] | None:
    """How `method path` sizes its body by the caller's plan; None: it does not."""
    return _PLAN_ROUTES.get(path.rstrip("/")) if method == "POST" else None


def body_limit_for(*, method: str, path: str, tenant: Tenant) -> BodyLimit:
    """The limit on a body `tenant` sends to `method path`."""
    route = plan_route(method, path)
    if route is not None:
        return ceiling(route(tenant))
    return ceiling(BodyLimit(DEFAULT_BODY_BYTES, "file_too_large", "this endpoint"))


def body_limit_check(*, method: str, path: str, content_length: str | None, tenant: Tenant) -> None:
    """Refuse a declared length over the route's limit, before the body is read.
    A body without one was cut off at the ceiling by the middleware, and Django's
    ASGI handler then declares its length (`chorus.asgi_handler`)."""
    declared = declared_length(content_length)
    if declared is None:
        return
    limit = body_limit_for(method=method, path=path, tenant=tenant)
    if declared > limit.max_bytes:
        raise BodyTooLarge(limit=limit, size=declared)


def declared_length(raw: bytes | str | None) -> int | None:
    """A Content-Length header's value, or None when it is missing or unreadable."""
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None
