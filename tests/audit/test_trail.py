"""The audit trail: an event per security-relevant change, in the change's
transaction, with who (key or staff user), when, the request id and the address;
read by its own tenant only, newest first, in cursor pages, by type and time."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import transaction
from django.test import Client
from django.utils import timezone

from audit.models import AuditEvent, EventType
from tenants.models import ApiKey, Plan
from tenants.services import api_key_create
from tests.assertions import assert_error
from tests.audio_files import audio_file
from tests.conftest import Persona, make_persona
from tests.synthesis.test_api_voices import upload

pytestmark = pytest.mark.embedded


@pytest.fixture
def _public_webhooks(settings: Any) -> None:
    settings.WEBHOOK_ALLOW_PRIVATE_URLS = True


@pytest.fixture
def operator(db: None) -> tuple[Client, Any]:
    user = get_user_model().objects.create_superuser("operator", "op@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client, user


def events(persona: Persona, type: str, target: str | None = None) -> list[AuditEvent]:
    found = AuditEvent.objects.filter(tenant=persona.tenant, type=type)
    if target is not None:
        found = found.filter(target=target)
    return list(found.order_by("created_at"))


def test_a_voice_created_and_deleted_through_the_api_names_the_key_request_and_address(
    alice: Persona,
) -> None:
    audio = SimpleUploadedFile("reference.wav", audio_file(4.0), "audio/wav")
    response = alice.client.post(
        "/v1/voices",
        {"name": "Narrator", "audio": audio},
        format="multipart",
        HTTP_X_REQUEST_ID="req-voice-1",
    )
    assert response.status_code == 201, response.content
    voice_id = response.json()["id"]
    alice.client.delete(f"/v1/voices/{voice_id}", HTTP_X_REQUEST_ID="req-voice-2")

    [created] = events(alice, EventType.VOICE_CREATED)
    [deleted] = events(alice, EventType.VOICE_DELETED)
    assert created.actor == f"key:{alice.api_key.prefix}"
    assert created.target == f"voice:{voice_id}"
    assert created.request_id == "req-voice-1"
    assert created.source_ip == "127.0.0.1"
    assert created.data["name"] == "Narrator"
    assert deleted.request_id == "req-voice-2"
    assert deleted.data["name"] == "Narrator"


def test_a_refused_upload_records_nothing(alice: Persona) -> None:
    response = upload(alice, b"not audio at all")

    assert response.status_code == 415
    assert not AuditEvent.objects.filter(type=EventType.VOICE_CREATED).exists()


def test_keys_created_rescoped_and_revoked_in_the_admin_name_the_staff_user(
    alice: Persona, operator: tuple[Client, Any]
) -> None:
    client, _ = operator
    response = client.post(
        "/admin/tenants/apikey/add/",
        {"tenant": alice.tenant.pk, "name": "ci", "scopes": ["read"], "requests_per_minute": ""},
        REMOTE_ADDR="203.0.113.7",
    )
    assert response.status_code == 200, response.content
    key = ApiKey.objects.get(tenant=alice.tenant, name="ci")
    client.post(
        f"/admin/tenants/apikey/{key.pk}/change/",
        {"name": "ci", "scopes": ["read", "speech:write"], "requests_per_minute": ""},
    )
    client.post(
        "/admin/tenants/apikey/",
        {"action": "revoke", "_selected_action": [key.pk]},
    )

    [created] = events(alice, EventType.KEY_CREATED, f"api_key:{key.prefix}")
    [updated] = events(alice, EventType.KEY_UPDATED)
    [revoked] = events(alice, EventType.KEY_REVOKED)
    assert created.actor == "staff:operator"
    assert created.source_ip == "203.0.113.7"
    assert created.target == f"api_key:{key.prefix}"
    assert created.data["scopes"] == ["read"]
    assert updated.actor == "staff:operator"
    assert updated.data == {"scopes": [["read"], ["read", "speech:write"]]}
    assert revoked.target == f"api_key:{key.prefix}"
    # The raw key is nowhere in the trail.
    assert all(key.key_hash not in str(e.data) for e in AuditEvent.objects.all())


def test_an_operators_change_to_a_tenant_names_them_and_what_changed(
    alice: Persona, operator: tuple[Client, Any]
) -> None:
    client, _ = operator
    bigger = Plan.objects.create(name="bigger")
    response = client.post(
        f"/admin/tenants/tenant/{alice.tenant.pk}/change/",
        {
            "name": "Alice",
            "active": "on",
            "plan": bigger.pk,
            "limit_overrides": '{"voice_slots": 9}',
            "billing_anchor": "",
            "api_keys-TOTAL_FORMS": "1",
            "api_keys-INITIAL_FORMS": "1",
            "api_keys-MIN_NUM_FORMS": "0",
            "api_keys-MAX_NUM_FORMS": "1000",
            "api_keys-0-id": alice.api_key.pk,
            "api_keys-0-tenant": alice.tenant.pk,
        },
    )
    assert response.status_code == 302, response.content

    [event] = events(alice, EventType.TENANT_UPDATED)
    assert event.actor == "staff:operator"
    assert event.data == {
        "plan": ["standard", "bigger"],
        "limit_overrides": [{}, {"voice_slots": 9}],
    }


def test_a_plan_changed_in_the_admin_is_recorded_for_the_staff_only(
    alice: Persona, operator: tuple[Client, Any]
) -> None:
    client, _ = operator
    plan = alice.tenant.plan
    form = {
        f.name: f.value_from_object(plan)
        for f in Plan._meta.concrete_fields
        if f.name not in {"id", "require_voice_consent"}
    }
    form["allowed_priorities"] = '["high", "normal", "low"]'
    form["voice_slots"] = 7
    form["require_voice_consent"] = "on"
    response = client.post(f"/admin/tenants/plan/{plan.pk}/change/", form)
    assert response.status_code == 302, response.content

    [event] = AuditEvent.objects.filter(type=EventType.PLAN_UPDATED)
    assert event.tenant_id is None
    assert event.data == {"voice_slots": [1000, 7], "require_voice_consent": [False, True]}
    listed = alice.client.get("/v1/audit-events").json()["results"]
    assert EventType.PLAN_UPDATED not in {e["type"] for e in listed}


@pytest.mark.usefixtures("_public_webhooks")
def test_webhook_endpoints_created_changed_rotated_and_deleted_are_recorded(
    alice: Persona,
) -> None:
    created = alice.client.post(
        "/v1/webhooks/endpoints", {"url": "https://example.com/hook"}, format="json"
    ).json()
    path = f"/v1/webhooks/endpoints/{created['id']}"
    alice.client.patch(path, {"enabled": False}, format="json")
    alice.client.post(f"{path}/rotate-secret")
    alice.client.delete(path)

    types = [e.type for e in AuditEvent.objects.filter(tenant=alice.tenant).order_by("created_at")]
    assert types == [
        EventType.TENANT_CREATED,  # the persona's own tenant and key
        EventType.KEY_CREATED,
        EventType.ENDPOINT_CREATED,
        EventType.ENDPOINT_UPDATED,
        EventType.ENDPOINT_SECRET_ROTATED,
        EventType.ENDPOINT_DELETED,
    ]
    [updated] = events(alice, EventType.ENDPOINT_UPDATED)
    assert updated.data == {"enabled": [True, False]}
    assert all(created["secret"] not in str(e.data) for e in AuditEvent.objects.all())


def test_an_event_is_undone_with_the_change_it_records(alice: Persona) -> None:
    def create_then_fail() -> None:
        with transaction.atomic():
            api_key_create(tenant=alice.tenant, name="doomed")
            raise RuntimeError

    with pytest.raises(RuntimeError):
        create_then_fail()

    assert not ApiKey.objects.filter(name="doomed").exists()
    assert not AuditEvent.objects.filter(data__name="doomed").exists()


# --- reading: GET /v1/audit-events --------------------------------------------------


def test_a_tenant_reads_its_own_events_only(alice: Persona, bob: Persona) -> None:
    upload(alice, audio_file(4.0))
    upload(bob, audio_file(4.0), name="Bob's")

    alice_events = alice.client.get("/v1/audit-events").json()["results"]
    bob_events = bob.client.get("/v1/audit-events").json()["results"]

    assert {e["type"] for e in alice_events} == {
        "tenant.created",
        "api_key.created",
        "voice.created",
    }
    assert [e["data"]["name"] for e in bob_events if e["type"] == "voice.created"] == ["Bob's"]
    alice_ids = {e["id"] for e in alice_events}
    assert alice_ids.isdisjoint({e["id"] for e in bob_events})
    # No route reads one event by id: there is nothing for bob to guess at.
    assert bob.client.get(f"/v1/audit-events/{alice_events[0]['id']}").status_code == 404


def test_reading_events_needs_the_audit_scope(alice: Persona) -> None:
    _, raw = api_key_create(tenant=alice.tenant, name="reader", scopes=["read"])
    alice.client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")

    response = alice.client.get("/v1/audit-events")

    error = assert_error(response, 403, "insufficient_scope")
    assert error["details"]["required"] == "audit:read"


def test_anonymous_callers_read_nothing(anonymous: Any, alice: Persona) -> None:
    assert_error(anonymous.get("/v1/audit-events"), 401, "unauthenticated")


def test_events_come_newest_first_in_cursor_pages(alice: Persona) -> None:
    for n in range(5):
        api_key_create(tenant=alice.tenant, name=f"k{n}")

    first = alice.client.get("/v1/audit-events?limit=2").json()
    second = alice.client.get(first["next"]).json()
    third = alice.client.get(second["next"]).json()

    fourth = alice.client.get(third["next"]).json()
    pages = (first, second, third, fourth)
    names = [e["data"]["name"] for page in pages for e in page["results"]]
    assert names == ["k4", "k3", "k2", "k1", "k0", "alice key", "Alice"]  # the last: the tenant
    assert fourth["next"] is None
    back = alice.client.get(second["previous"]).json()
    assert [e["data"]["name"] for e in back["results"]] == ["k4", "k3"]


def test_events_filter_by_type_and_time(alice: Persona) -> None:
    api_key_create(tenant=alice.tenant, name="later")
    upload(alice, audio_file(4.0))
    old = AuditEvent.objects.get(tenant=alice.tenant, data__name="alice key")
    cut = old.created_at + timedelta(microseconds=1)

    by_type = alice.client.get("/v1/audit-events", {"type": "voice.created"}).json()["results"]
    both = alice.client.get("/v1/audit-events", {"type": "voice.created,api_key.created"}).json()[
        "results"
    ]
    since = alice.client.get("/v1/audit-events", {"since": cut.isoformat()}).json()["results"]
    until = alice.client.get("/v1/audit-events", {"until": cut.isoformat()}).json()["results"]

    assert [e["type"] for e in by_type] == ["voice.created"]
    assert len(both) == 3
    assert old.id.hex not in {e["id"].replace("-", "") for e in since}
    assert len(since) == 2
    assert [e["data"]["name"] for e in until] == ["alice key", "Alice"]
    future = (timezone.now() + timedelta(days=1)).isoformat()
    assert alice.client.get("/v1/audit-events", {"since": future}).json()["results"] == []


@pytest.mark.parametrize(
    "query",
    [{"type": "voice.exploded"}, {"since": "yesterday"}, {"until": "2026-01-01T00:00:00"}],
)
def test_a_bad_filter_is_refused_with_the_field_named(
    alice: Persona, query: dict[str, str]
) -> None:
    error = assert_error(alice.client.get("/v1/audit-events", query), 400, "invalid_request")
    assert error["details"]["field"] == next(iter(query))


def test_an_outsider_tenant_with_the_same_names_sees_none_of_alices_trail(
    alice: Persona, plan: Plan
) -> None:
    charlie = make_persona("charlie", plan)
    upload(alice, audio_file(4.0))

    results = charlie.client.get("/v1/audit-events").json()["results"]

    assert [e["target"] for e in results] == [f"api_key:{charlie.api_key.prefix}", "tenant:charlie"]
