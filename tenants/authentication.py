"""API-key authentication, parsed in one place for every way a request comes in.

`api_key_from_credentials` (sync) and `api_key_from_credentials_async` take the
raw `Authorization` header value, or a WebSocket's `?token=`, and return the
live key (its tenant and plan loaded) or raise an `AuthenticationError` with a
stable code. DRF's `ApiKeyAuthentication`, the async OpenAI-compatible view and
the body-limit middleware all call them. Scoping is enforced here once: every API
view gets `request.user` as a `TenantPrincipal` and `request.auth` as its
`ApiKey`, and reads the tenant from it, never from the URL or body.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from chorus.errors import ChorusError
from chorus.logs import log_bind
from tenants.key_cache import key_cache_get
from tenants.keys import hash_key, looks_like_key
from tenants.models import ApiKey, Tenant
from tenants.services import api_key_authenticate

WWW_AUTHENTICATE = 'Bearer realm="chorus"'
TENANT_DISABLED = "This tenant is disabled. Contact the operator of this service."
_BEARER = b"bearer"


class AuthenticationError(ChorusError):
    """Credentials refused: 401 with the Bearer challenge (403 for a disabled tenant)."""

    status = 401
    code = "unauthenticated"

    def __init__(self, message: str) -> None:
        headers = {"WWW-Authenticate": WWW_AUTHENTICATE} if self.status == 401 else None
        super().__init__(message, headers=headers)


class MissingCredentials(AuthenticationError):
    code = "unauthenticated"


class InvalidAuthorization(AuthenticationError):
    code = "invalid_authorization"


class InvalidApiKey(AuthenticationError):
    code = "invalid_api_key"


class TenantDisabled(AuthenticationError):
    status = 403
    code = "tenant_inactive"

    def __init__(self, api_key: ApiKey) -> None:
        super().__init__(TENANT_DISABLED)
        self.api_key = api_key  # the body limits still size by its plan


def raw_key(*, authorization: bytes | str | None = None, token: str | None = None) -> str:
    """The key a request carries: `Authorization: Bearer <key>`, or (a WebSocket,
    where browsers cannot set headers) `?token=<key>`; never both."""
    if isinstance(authorization, str):
        # As DRF reads it: a header value is Latin-1 on the wire.
        authorization = authorization.encode("iso-8859-1", errors="replace")
    if authorization and token:
        raise InvalidAuthorization("Send the API key once: in the header or as ?token=.")
    if token:
        return token
    parts = (authorization or b"").split()
    if not parts:
        raise MissingCredentials(
            "No API key: send it as the header 'Authorization: Bearer <api key>'."
        )
    if parts[0].lower() != _BEARER or len(parts) != 2:
        raise InvalidAuthorization("Use the header 'Authorization: Bearer <api key>'.")
    try:
        return parts[1].decode()
    except UnicodeDecodeError:
        raise InvalidApiKey("Invalid API key.") from None


def api_key_from_credentials(
    *, authorization: bytes | str | None = None, token: str | None = None
) -> ApiKey:
    """The live key of an active tenant, or an `AuthenticationError`."""
    raw = raw_key(authorization=authorization, token=token)
    return _admitted(api_key_authenticate(raw=raw))


async def api_key_from_credentials_async(
    *, authorization: bytes | str | None = None, token: str | None = None
) -> ApiKey:
    """As `api_key_from_credentials`; a key this process has checked lately is
    found in memory (`tenants.key_cache`) without leaving the event loop."""
    raw = raw_key(authorization=authorization, token=token)
    cached = key_cache_get(hash_key(raw)) if looks_like_key(raw) else None
    return _admitted(cached if cached is not None else await _look_up(raw))


@sync_to_async
def _look_up(raw: str) -> ApiKey | None:
    # Outside Django's request cycle nothing else replaces a dead connection.
    close_old_connections()
    try:
        return api_key_authenticate(raw=raw)
    finally:
        close_old_connections()


def _admitted(key: ApiKey | None) -> ApiKey:
    if key is None:
        raise InvalidApiKey("Unknown or revoked API key.")
    log_bind(tenant_id=key.tenant_id)  # the request's log lines name the tenant
    if not key.tenant.active:
        raise TenantDisabled(key)
    return key


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
    default_detail = TENANT_DISABLED
    default_code = "tenant_inactive"


def drf_error(error: AuthenticationError) -> exceptions.APIException:
    """The DRF exception for `error`: DRF answers a 401 with the view's challenge
    and remembers that the request is unauthenticated."""
    if isinstance(error, TenantDisabled):
        return TenantInactive(error.message)
    if isinstance(error, MissingCredentials):
        return exceptions.NotAuthenticated(error.message)
    return exceptions.AuthenticationFailed(error.message, code=error.code)


def principal_from_request(request: Any) -> TenantPrincipal:
    """The caller of a view that is not a DRF view (Django's `HttpRequest`), with
    the errors DRF's path raises, the 401s carrying the challenge."""
    try:
        key = api_key_from_credentials(authorization=get_authorization_header(request))
    except AuthenticationError as error:
        exc = drf_error(error)
        if error.status == 401:
            exc.auth_header = WWW_AUTHENTICATE  # type: ignore[attr-defined]
        raise exc from None
    return TenantPrincipal(tenant=key.tenant, api_key=key)


class ApiKeyAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[TenantPrincipal, ApiKey] | None:
        try:
            key = api_key_from_credentials(authorization=get_authorization_header(request))
        except MissingCredentials:
            return None  # the permission answers 401 unauthenticated
        except AuthenticationError as error:
            raise drf_error(error) from None
        return TenantPrincipal(tenant=key.tenant, api_key=key), key

    def authenticate_header(self, request: Request) -> str:
        return WWW_AUTHENTICATE


class IsTenant(BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.user, TenantPrincipal)
