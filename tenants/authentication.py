"""Bearer API-key authentication; the tenant becomes the request's principal.

Scoping is enforced here once: every API view gets `request.user` as a
`TenantPrincipal` and reads the tenant from it, never from the URL or body.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from chorus.logs import log_bind
from tenants.models import ApiKey, Tenant
from tenants.services import api_key_authenticate


@dataclass(frozen=True)
class TenantPrincipal:
    tenant: Tenant
    api_key: ApiKey

    is_authenticated = True
    is_anonymous = False
    is_staff = False

    @property
    def pk(self) -> int:
        return self.tenant.pk


class TenantInactive(exceptions.PermissionDenied):
    default_detail = "This tenant is disabled. Contact the operator of this service."
    default_code = "tenant_inactive"


class ApiKeyAuthentication(BaseAuthentication):
    keyword = b"bearer"

    def authenticate(self, request: Request) -> tuple[TenantPrincipal, ApiKey] | None:
        header = get_authorization_header(request).split()
        if not header:
            return None
        if header[0].lower() != self.keyword or len(header) != 2:
            raise exceptions.AuthenticationFailed(
                "Use the header 'Authorization: Bearer <api key>'.", code="invalid_authorization"
            )
        try:
            raw = header[1].decode()
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed(
                "Invalid API key.", code="invalid_api_key"
            ) from None
        key = api_key_authenticate(raw=raw)
        if key is None:
            raise exceptions.AuthenticationFailed(
                "Unknown or revoked API key.", code="invalid_api_key"
            )
        log_bind(tenant_id=key.tenant_id)  # the request's log lines name the tenant
        if not key.tenant.active:
            raise TenantInactive()
        return TenantPrincipal(tenant=key.tenant, api_key=key), key

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="chorus"'


class IsTenant(BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.user, TenantPrincipal)
