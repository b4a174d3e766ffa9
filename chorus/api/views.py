from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from chorus.body_limit import body_limit_check
from chorus.errors import InvalidInput
from quotas.errors import InsufficientScope, RateLimited
from quotas.plans import tenant_limits
from quotas.ratelimit import RateDecision, rate_limit_hit
from tenants.authentication import TenantPrincipal
from tenants.models import ApiKey, Tenant

_READ_METHODS = {"GET", "HEAD", "OPTIONS"}


class TenantAPIView(APIView):
    """Base of every tenant-facing view. Enforced here, once, for every route:
    the tenant comes from the API key only, the key must hold the route's
    scope, the body is within the route's limit (`chorus.body_limit`), and the
    request counts against the tenant's and the key's rate."""

    write_scope = ""  # the scope a non-read method needs, e.g. "speech:write"

    @property
    def principal(self) -> TenantPrincipal:
        user: Any = self.request.user
        assert isinstance(user, TenantPrincipal)  # guaranteed by the IsTenant permission
        return user

    @property
    def tenant(self) -> Tenant:
        return self.principal.tenant

    @property
    def api_key(self) -> ApiKey:
        return self.principal.api_key

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # authentication and permissions first
        self._check_scope(request)
        body_limit_check(
            method=request.method or "",
            path=request.path,
            content_length=request.META.get("CONTENT_LENGTH"),
            tenant=self.tenant,
        )
        self._rate = self._check_rate()

    def _check_scope(self, request: Request) -> None:
        needed = "read" if request.method in _READ_METHODS else self.write_scope
        check_scope(api_key=self.api_key, needed=needed)

    def _check_rate(self) -> RateDecision | None:
        reads = self.request.method in _READ_METHODS
        return check_rate(tenant=self.tenant, api_key=self.api_key, reads=reads)

    def finalize_response(
        self, request: Request, response: Response, *args: Any, **kwargs: Any
    ) -> Response:
        decision = getattr(self, "_rate", None)
        if decision is not None:
            for name, value in rate_headers(decision).items():
                response[name] = value
        return super().finalize_response(request, response, *args, **kwargs)


# Also used by the async streaming views (synthesis/api/openai.py), which are not DRF views.
def check_scope(*, api_key: ApiKey, needed: str) -> None:
    if needed and needed not in api_key.scopes:
        raise InsufficientScope(
            f"This API key does not have the '{needed}' scope.",
            details={"required": needed, "granted": list(api_key.scopes)},
        )


def check_rate(*, tenant: Tenant, api_key: ApiKey, reads: bool = False) -> RateDecision | None:
    """Count the request in its window: writes against the plan's (or the key's)
    requests per minute; reads (job polls, lists, usage) in windows of their own,
    `READ_RATE_MULTIPLIER` times larger, so waiting on a job never starves submits."""
    tenant_limit = tenant_limits(tenant).requests_per_minute
    key_limit = api_key.requests_per_minute or tenant_limit
    if reads:
        tenant_limit *= settings.READ_RATE_MULTIPLIER
        key_limit *= settings.READ_RATE_MULTIPLIER
    decision = rate_limit_hit(
        tenant_id=tenant.pk,
        key_id=api_key.pk,
        tenant_limit=tenant_limit,
        key_limit=key_limit,
        reads=reads,
    )
    if decision is not None and not decision.allowed:
        raise RateLimited(
            f"Too many requests: {decision.limit} per minute for this "
            f"{'API key' if decision.scope == 'key' else 'account'}. "
            f"Retry in {decision.reset_seconds} s.",
            details={"limit": decision.limit, "window_seconds": 60, "scope": decision.scope},
            headers={**rate_headers(decision), "Retry-After": str(decision.reset_seconds)},
        )
    return decision


def rate_headers(decision: RateDecision) -> dict[str, str]:
    return {
        "X-RateLimit-Limit": str(decision.limit),
        "X-RateLimit-Remaining": str(decision.remaining),
        "X-RateLimit-Reset": str(decision.reset_seconds),
    }


def idempotency_key_header(request: Request) -> str:
    """The request's `Idempotency-Key` ("" without one), at most 255 characters."""
    key = request.headers.get("Idempotency-Key", "").strip()
    if len(key) > 255:
        raise InvalidInput(
            "Idempotency-Key is longer than 255 characters.", details={"length": len(key)}
        )
    return key
