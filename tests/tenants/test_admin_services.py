"""The admin saves tenants and keys through their services, and shows what the
services refuse on the form (never a 500)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db.models.signals import post_save
from django.test import Client
from django.urls import reverse

from quotas.counters import storage_add, storage_used
from tenants import services
from tenants.models import ApiKey, Plan, Tenant
from tests.conftest import Persona
from tests.tenants.test_admin import tenant_form


@pytest.fixture
def operator(db: None) -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("op", "op@example.com", "pw"))
    return client


def tenant_change_form(persona: Persona, **fields: Any) -> dict[str, Any]:
    """The admin's change form of a tenant as drawn, its one key inline unchanged."""
    tenant = persona.tenant
    return {
        "name": tenant.name,
        "active": "on",
        "plan": tenant.plan_id,
        "limit_overrides": json.dumps(tenant.limit_overrides),
        "billing_anchor": "",
        "api_keys-TOTAL_FORMS": "1",
        "api_keys-INITIAL_FORMS": "1",
        "api_keys-MIN_NUM_FORMS": "0",
        "api_keys-MAX_NUM_FORMS": "1000",
        "api_keys-0-id": persona.api_key.pk,
        "api_keys-0-tenant": tenant.pk,
        **fields,
    }


def test_a_tenant_added_in_the_admin_is_made_by_tenant_create(
    operator: Client, plan: Plan, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[dict[str, Any]] = []

    def recording_create(**kwargs: Any) -> Tenant:
        made.append(kwargs)
        return services.tenant_create(**kwargs)

    monkeypatch.setattr("tenants.admin.tenant_create", recording_create)
    form = {**tenant_form(plan, "globex"), "limit_overrides": '{"voice_slots": 9}'}

    response = operator.post(reverse("admin:tenants_tenant_add"), form)

    assert response.status_code == 302, response.content.decode()
    assert [(m["slug"], m["bucket"], m["limit_overrides"]) for m in made] == [
        ("globex", "chorus-globex", {"voice_slots": 9})
    ]
    assert Tenant.objects.get(slug="globex").limit_overrides == {"voice_slots": 9}


def test_a_tenant_changed_in_the_admin_is_saved(operator: Client, alice: Persona) -> None:
    url = reverse("admin:tenants_tenant_change", args=[alice.tenant.pk])

    response = operator.post(
        url, tenant_change_form(alice, name="Alice Ltd", limit_overrides='{"voice_slots": 2}')
    )

    assert response.status_code == 302, response.content.decode()
    alice.tenant.refresh_from_db()
    assert (alice.tenant.name, alice.tenant.limit_overrides) == ("Alice Ltd", {"voice_slots": 2})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ('{"link_ttl_second": 3}', "Unknown limit &#x27;link_ttl_second&#x27;; use one of "),
        ('{"monthly_characters": "lots"}', "monthly_characters must be a non-negative number."),
        ('{"allowed_priorities": "high"}', "allowed_priorities must be a non-empty list"),
        ('["voice_slots"]', "Overrides must be a JSON object."),
    ],
)
def test_bad_limit_overrides_are_shown_on_the_tenants_page_and_nothing_is_saved(
    operator: Client, alice: Persona, overrides: str, message: str
) -> None:
    url = reverse("admin:tenants_tenant_change", args=[alice.tenant.pk])

    response = operator.post(
        url, tenant_change_form(alice, name="Renamed", limit_overrides=overrides)
    )

    assert response.status_code == 200
    page = response.content.decode()
    assert message in page
    assert "limit_overrides" in response.context["adminform"].form.errors
    if "Unknown limit" in message:  # the allowed names are listed
        assert "link_ttl_seconds, output_retention_days, storage_bytes" in page
    stored = Tenant.objects.get(pk=alice.tenant.pk)
    assert (stored.name, stored.limit_overrides) == (alice.tenant.name, {})


# --- API keys ---------------------------------------------------------------------


def test_a_key_added_in_the_admin_is_written_once(operator: Client, alice: Persona) -> None:
    saves: list[tuple[bool, Any]] = []

    def record(*, created: bool, update_fields: Any, **kwargs: Any) -> None:
        saves.append((created, update_fields))

    post_save.connect(record, sender=ApiKey, dispatch_uid="test-key-saves")
    try:
        response = operator.post(
            reverse("admin:tenants_apikey_add"),
            {"tenant": alice.tenant.pk, "name": "ci", "scopes": ["read"], "requests_per_minute": 7},
        )
    finally:
        post_save.disconnect(dispatch_uid="test-key-saves")

    assert response.status_code == 200, response.content.decode()
    assert saves == [(True, None)]
    key = ApiKey.objects.get(name="ci")
    assert (key.scopes, key.requests_per_minute) == (["read"], 7)


def test_a_keys_new_scopes_hold_at_once(operator: Client, alice: Persona, settings: Any) -> None:
    settings.API_KEY_CACHE_S = 60  # the key is remembered once it has authenticated
    assert alice.client.get("/v1/voices").status_code == 200

    response = operator.post(
        reverse("admin:tenants_apikey_change", args=[alice.api_key.pk]),
        {"name": "no reading", "scopes": ["speech:write"], "requests_per_minute": ""},
    )

    assert response.status_code == 302, response.content.decode()
    assert alice.client.get("/v1/voices").status_code == 403
    alice.api_key.refresh_from_db()
    assert (alice.api_key.name, alice.api_key.scopes) == ("no reading", ["speech:write"])


def test_a_tenants_storage_is_shown_in_human_sizes(operator: Client, alice: Persona) -> None:
    storage_used(tenant_id=alice.tenant.pk)  # the counter opens at 0
    storage_add(tenant_id=alice.tenant.pk, delta=54_757_398)
    alice.tenant.limit_overrides = {"storage_bytes": 20 * 1024**3}
    alice.tenant.save()

    page = operator.get(reverse("admin:tenants_tenant_change", args=[alice.tenant.pk]))

    assert "<tr><th>Storage</th><td>52.2 MiB of 20 GiB</td></tr>" in page.content.decode()
