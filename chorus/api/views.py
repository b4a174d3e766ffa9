from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from django.http import HttpRequest
from rest_framework.exceptions import NotAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from chorus.errors import InvalidInput

if TYPE_CHECKING:
    from tenants.authentication import TenantPrincipal
    from tenants.models import ApiKey, Tenant

_READ_METHODS = {"GET", "HEAD", "OPTIONS"}

# What a tenant request passes once its key is known (scope, body limit, rate):
# it raises the first failure's error, else returns the headers for the response.
# The core cannot import the apps above it, so the app that owns those checks
# registers them when ready (`quotas.admission.tenant_request_admit`).
TenantAdmission = Callable[..., dict[str, str]]
_admission: list[TenantAdmission] = []


def register_tenant_admission(admit: TenantAdmission) -> None:
    _admission[:] = [admit]


class TenantAPIView(APIView):
    """Base of every tenant-facing view. Enforced here, once, for every route:
    the tenant comes from the API key only (`tenants.authentication`), then the
    registered admission: the key must hold the route's scope, the body is within
    the route's limit (`quotas.body_limits`), and the request counts against the
    tenant's and the key's rate."""

    write_scope = ""  # the scope a non-read method needs, e.g. "speech:write"
    read_scope = "read"  # the scope a read needs

    @property
    def principal(self) -> TenantPrincipal:
        # Guaranteed by the IsTenant permission.
        user: TenantPrincipal = self.request.user  # type: ignore[assignment]
        return user

    @property
    def tenant(self) -> Tenant:
        return self.principal.tenant

    @property
    def api_key(self) -> ApiKey:
        return self.principal.api_key

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # authentication and permissions first
        assert _admission, "quotas registers the tenant admission when ready"
        needed = self.read_scope if request.method in _READ_METHODS else self.write_scope
        django_request: HttpRequest = request._request
        self._admitted_headers = _admission[0](
            django_request, tenant=self.tenant, api_key=self.api_key, scope=needed
        )

    def permission_denied(
        self, request: Request, message: str | None = None, code: str | None = None
    ) -> NoReturn:
        if request.successful_authenticator is None and not request.auth:
            # No key at all: say where one goes (a newcomer's first request often
            # sends none, or sends it as X-API-Key, which Chorus does not read).
            raise NotAuthenticated(missing_key_message(request.headers))
        super().permission_denied(request, message=message, code=code)

    def finalize_response(
        self, request: Request, response: Response, *args: Any, **kwargs: Any
    ) -> Response:
        for name, value in getattr(self, "_admitted_headers", {}).items():
            response[name] = value
        return super().finalize_response(request, response, *args, **kwargs)


def missing_key_message(headers: Any) -> str:
    """What a request without an `Authorization` header is told."""
    use = "send it as the header 'Authorization: Bearer <api key>'"
    if headers.get("X-API-Key"):
        return f"The X-API-Key header is not read: {use}."
    return f"No API key: {use}."


def idempotency_key_header(request: Request) -> str:
    """The request's `Idempotency-Key` ("" without one), at most 255 characters."""
    key = request.headers.get("Idempotency-Key", "").strip()
    if len(key) > 255:
        raise InvalidInput(
            "Idempotency-Key is longer than 255 characters.", details={"length": len(key)}
        )
    return key
