"""What every tenant request passes once its key is known: the key holds the
route's scope, the body is within the route's limit, the request counts against
the tenant's and the key's rate. `TenantAPIView` runs it for every DRF route
(registered in `QuotasConfig.ready`: the core's base view cannot import the apps
above it) and the async views that are not DRF views call it themselves."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest

from quotas.body_limits import body_limit_check
from quotas.errors import InsufficientScope, RateLimited
from quotas.plans import tenant_limits
from quotas.ratelimit import RateDecision, rate_limit_hit
from tenants.models import ApiKey, Tenant

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def tenant_request_admit(
    request: HttpRequest, *, tenant: Tenant, api_key: ApiKey, scope: str
) -> dict[str, str]:
    """Raise the error of the first check `request` fails; else the rate headers
    its response carries (none where rate limiting is off)."""
    check_scope(api_key=api_key, needed=scope)
    body_limit_check(
        method=request.method or "",
        path=request.path,
        content_length=request.META.get("CONTENT_LENGTH"),
        tenant=tenant,
    )
    decision = check_rate(tenant=tenant, api_key=api_key, reads=request.method in READ_METHODS)
    return rate_headers(decision) if decision is not None else {}


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
