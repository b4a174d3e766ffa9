"""One authentication path: the raw `Authorization` value (or a WebSocket's
`?token=`) gives the live key or a typed error, sync and async alike."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tenants.authentication import (
    AuthenticationError,
    InvalidApiKey,
    InvalidAuthorization,
    MissingCredentials,
    TenantDisabled,
    api_key_from_credentials,
    api_key_from_credentials_async,
    raw_key,
)
from tenants.services import api_key_revoke
from tests.conftest import Persona

pytestmark = [pytest.mark.embedded, pytest.mark.django_db(transaction=True)]


def test_a_bearer_header_gives_alices_key_and_tenant(alice: Persona) -> None:
    key = api_key_from_credentials(authorization=f"Bearer {alice.key}")

    assert key.pk == alice.api_key.pk
    assert key.tenant == alice.tenant


def test_the_header_may_come_as_bytes_and_the_keyword_in_any_case(alice: Persona) -> None:
    key = api_key_from_credentials(authorization=f"bEaReR {alice.key}".encode())

    assert key.pk == alice.api_key.pk


def test_a_websocket_token_gives_the_same_key_as_the_header(alice: Persona) -> None:
    assert api_key_from_credentials(token=alice.key).pk == alice.api_key.pk


def test_the_async_path_gives_the_same_key(alice: Persona) -> None:
    key = async_to_sync(api_key_from_credentials_async)(authorization=f"Bearer {alice.key}")

    assert key.pk == alice.api_key.pk
    assert key.tenant.plan_id == alice.tenant.plan_id


@pytest.mark.parametrize(
    ("authorization", "token", "error", "code"),
    [
        (None, None, MissingCredentials, "unauthenticated"),
        ("", None, MissingCredentials, "unauthenticated"),
        ("Basic dXNlcjpwYXNz", None, InvalidAuthorization, "invalid_authorization"),
        ("Bearer", None, InvalidAuthorization, "invalid_authorization"),
        ("Bearer a b", None, InvalidAuthorization, "invalid_authorization"),
        (b"Bearer \xff\xfe", None, InvalidApiKey, "invalid_api_key"),
        ("Bearer ck_not_a_key", None, InvalidApiKey, "invalid_api_key"),
        (None, "ck_" + "x" * 43, InvalidApiKey, "invalid_api_key"),
    ],
)
def test_bad_credentials_raise_a_typed_error_with_a_stable_code(
    authorization: str | bytes | None,
    token: str | None,
    error: type[AuthenticationError],
    code: str,
) -> None:
    with pytest.raises(error) as raised:
        api_key_from_credentials(authorization=authorization, token=token)

    assert raised.value.code == code
    assert raised.value.status == 401
    assert raised.value.headers == {"WWW-Authenticate": 'Bearer realm="chorus"'}
    with pytest.raises(error):
        async_to_sync(api_key_from_credentials_async)(authorization=authorization, token=token)


def test_a_key_in_the_header_and_as_a_token_is_refused(alice: Persona) -> None:
    with pytest.raises(InvalidAuthorization):
        raw_key(authorization=f"Bearer {alice.key}", token=alice.key)


def test_a_revoked_key_is_refused_on_both_paths(alice: Persona) -> None:
    api_key_revoke(api_key=alice.api_key)

    with pytest.raises(InvalidApiKey):
        api_key_from_credentials(authorization=f"Bearer {alice.key}")
    with pytest.raises(InvalidApiKey):
        async_to_sync(api_key_from_credentials_async)(authorization=f"Bearer {alice.key}")


def test_a_disabled_tenant_is_refused_with_403_and_its_key(alice: Persona) -> None:
    alice.tenant.active = False
    alice.tenant.save(update_fields=["active"])

    with pytest.raises(TenantDisabled) as raised:
        api_key_from_credentials(token=alice.key)

    assert (raised.value.status, raised.value.code) == (403, "tenant_inactive")
    assert raised.value.api_key.pk == alice.api_key.pk
    assert raised.value.headers == {}


def test_the_async_path_finds_a_cached_key_without_a_query(alice: Persona, settings) -> None:
    settings.API_KEY_CACHE_S = 60
    api_key_from_credentials(authorization=f"Bearer {alice.key}")  # remembered

    with CaptureQueriesContext(connection) as queries:
        key = async_to_sync(api_key_from_credentials_async)(authorization=f"Bearer {alice.key}")

    assert key.pk == alice.api_key.pk
    assert len(queries) == 0
