"""API keys: what is generated, what is stored, and how a request is authenticated."""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta

from django.utils import timezone
from rest_framework.test import APIClient

from tenants.keys import generate_key
from tenants.models import ApiKey
from tenants.services import api_key_create, api_key_revoke
from tests.assertions import assert_error
from tests.conftest import Persona

KEY_FORMAT = re.compile(r"ck_[A-Za-z0-9_-]{32,}")


def client_with(authorization: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=authorization)
    return client


# --- format and storage -----------------------------------------------------------


def test_a_generated_key_is_ck_followed_by_at_least_32_url_safe_characters() -> None:
    keys = {generate_key().raw for _ in range(20)}
    assert len(keys) == 20
    for raw in keys:
        assert KEY_FORMAT.fullmatch(raw), raw


def test_it_stores_only_the_sha256_hash_and_the_prefix_of_a_key(alice: Persona) -> None:
    api_key, raw = api_key_create(tenant=alice.tenant, name="ci")

    row = ApiKey.objects.filter(pk=api_key.pk).values().get()
    assert KEY_FORMAT.fullmatch(raw)
    assert row["key_hash"] == hashlib.sha256(raw.encode()).hexdigest()
    assert row["prefix"] == raw[3:13]
    assert not any(raw in str(value) for value in row.values())
    assert not any(raw[3:] in str(value) for value in row.values())


def test_two_keys_of_one_tenant_both_authenticate(alice: Persona) -> None:
    _, second = api_key_create(tenant=alice.tenant, name="second")

    assert alice.client.get("/v1/voices").status_code == 200
    assert client_with(f"Bearer {second}").get("/v1/voices").status_code == 200


# --- refusals ---------------------------------------------------------------------


def test_a_request_without_credentials_is_refused_with_401_and_a_challenge(
    anonymous: APIClient, alice: Persona
) -> None:
    response = anonymous.get("/v1/voices")

    assert_error(response, 401, "unauthenticated")
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_request_with_another_scheme_is_refused_with_401(alice: Persona) -> None:
    for header in (f"Token {alice.key}", f"Basic {alice.key}", "Bearer", f"Bearer {alice.key} x"):
        response = client_with(header).get("/v1/voices")

        assert_error(response, 401, "invalid_authorization")
        assert response["WWW-Authenticate"].startswith("Bearer")


def test_an_unknown_key_is_refused_with_401_invalid_api_key(alice: Persona) -> None:
    unknown = generate_key().raw
    same_prefix = alice.key[:-4] + ("AAAA" if not alice.key.endswith("AAAA") else "BBBB")

    for raw in (unknown, same_prefix, "ck_short", "not-a-key"):
        response = client_with(f"Bearer {raw}").get("/v1/voices")

        assert_error(response, 401, "invalid_api_key")


def test_a_revoked_key_is_refused_from_the_next_request_on(alice: Persona) -> None:
    assert alice.client.get("/v1/voices").status_code == 200

    api_key_revoke(api_key=alice.api_key)

    assert_error(alice.client.get("/v1/voices"), 401, "invalid_api_key")
    assert_error(
        alice.client.post("/v1/speech", {"text": "hi"}, format="json"), 401, "invalid_api_key"
    )


def test_revoking_a_key_leaves_the_tenants_other_keys_working(alice: Persona) -> None:
    _, other = api_key_create(tenant=alice.tenant, name="other")

    api_key_revoke(api_key=alice.api_key)

    assert client_with(f"Bearer {other}").get("/v1/voices").status_code == 200


def test_a_key_of_an_inactive_tenant_is_refused_with_403_tenant_inactive(alice: Persona) -> None:
    alice.tenant.active = False
    alice.tenant.save(update_fields=["active"])

    assert_error(alice.client.get("/v1/voices"), 403, "tenant_inactive")


def test_an_inactive_tenant_does_not_affect_another_tenant(alice: Persona, bob: Persona) -> None:
    alice.tenant.active = False
    alice.tenant.save(update_fields=["active"])

    assert bob.client.get("/v1/voices").status_code == 200


# --- bookkeeping ------------------------------------------------------------------


def test_a_successful_request_records_when_the_key_was_last_used(alice: Persona) -> None:
    assert alice.api_key.last_used_at is None
    before = timezone.now()

    assert alice.client.get("/v1/voices").status_code == 200

    alice.api_key.refresh_from_db()
    assert alice.api_key.last_used_at is not None
    assert before <= alice.api_key.last_used_at <= timezone.now()


def test_last_used_at_is_written_at_most_once_a_minute(alice: Persona) -> None:
    recent = timezone.now() - timedelta(seconds=30)
    ApiKey.objects.filter(pk=alice.api_key.pk).update(last_used_at=recent)

    assert alice.client.get("/v1/voices").status_code == 200

    alice.api_key.refresh_from_db()
    assert alice.api_key.last_used_at == recent


def test_last_used_at_is_refreshed_once_a_minute_has_passed(alice: Persona) -> None:
    stale = timezone.now() - timedelta(minutes=5)
    ApiKey.objects.filter(pk=alice.api_key.pk).update(last_used_at=stale)

    assert alice.client.get("/v1/voices").status_code == 200

    alice.api_key.refresh_from_db()
    assert alice.api_key.last_used_at is not None
    assert alice.api_key.last_used_at > stale


def test_a_refused_key_does_not_record_a_use(alice: Persona) -> None:
    api_key_revoke(api_key=alice.api_key)

    alice.client.get("/v1/voices")

    alice.api_key.refresh_from_db()
    assert alice.api_key.last_used_at is None
