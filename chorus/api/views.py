from __future__ import annotations

from typing import Any

from rest_framework.views import APIView

from tenants.authentication import TenantPrincipal
from tenants.models import ApiKey, Tenant


class TenantAPIView(APIView):
    """Base of every tenant-facing view: the tenant comes from the API key, only."""

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
