"""/v1/webhooks/endpoints: managed with the tenant's key, scoped to the tenant,
bad input refused with a stable code and nothing stored."""

from __future__ import annotations

from typing import Any

import pytest

from tenants.services import api_key_create
from tests.conftest import Persona
from tests.webhooks.conftest import Published, endpoint_for
from tests.webhooks.receiver import Receiver
from webhooks.events import event_publish
from webhooks.models import WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db

URL = "https://hooks.example.invalid/chorus"  # a name that does not resolve yet is accepted


def create(persona: Persona, **body: Any) -> Any:
    return persona.client.post("/v1/webhooks/endpoints", {"url": URL, **body}, format="json")


def error_code(response: Any) -> str:
    return str(response.json()["error"]["code"])


def test_creating_an_endpoint_shows_its_secret_once(alice: Persona) -> None:
    response = create(alice, description="prod")
    assert response.status_code == 201
    body = response.json()
    assert body["secret"].startswith("whsec_")
    assert body["event_types"] == ["speech.succeeded", "speech.failed", "batch.completed"]
    assert (body["url"], body["enabled"], body["description"]) == (URL, True, "prod")

    read = alice.client.get(f"/v1/webhooks/endpoints/{body['id']}").json()
    assert "secret" not in read
    listed = alice.client.get("/v1/webhooks/endpoints").json()["results"]
    assert [e["id"] for e in listed] == [body["id"]]
    assert "secret" not in listed[0]


def test_rotating_gives_a_new_secret(alice: Persona) -> None:
    created = create(alice).json()
    rotated = alice.client.post(f"/v1/webhooks/endpoints/{created['id']}/rotate-secret")
    assert rotated.status_code == 200
    assert rotated.json()["secret"].startswith("whsec_")
    assert rotated.json()["secret"] != created["secret"]
    assert WebhookEndpoint.objects.get().secret == rotated.json()["secret"]


def test_an_endpoint_can_be_changed_and_disabled(alice: Persona) -> None:
    created = create(alice).json()
    response = alice.client.patch(
        f"/v1/webhooks/endpoints/{created['id']}",
        {"enabled": False, "event_types": ["speech.failed"]},
        format="json",
    )
    assert response.status_code == 200
    assert (response.json()["enabled"], response.json()["event_types"]) == (
        False,
        ["speech.failed"],
    )


def test_deleting_an_endpoint_removes_it(alice: Persona) -> None:
    created = create(alice).json()
    assert alice.client.delete(f"/v1/webhooks/endpoints/{created['id']}").status_code == 204
    assert not WebhookEndpoint.objects.exists()


def test_a_loopback_url_is_refused_with_the_setting_that_allows_it(alice: Persona) -> None:
    response = create(alice, url="http://127.0.0.1:9000/hooks")

    assert response.status_code == 400
    assert error_code(response) == "webhook_address_not_allowed"
    assert "CHORUS_WEBHOOK_ALLOW_PRIVATE=true" in response.json()["error"]["message"]
    assert not WebhookEndpoint.objects.exists()


def test_a_cloud_metadata_url_is_refused_without_a_setting_to_allow_it(alice: Persona) -> None:
    response = create(alice, url="http://169.254.169.254/latest/meta-data/")

    assert error_code(response) == "webhook_address_not_allowed"
    assert "CHORUS_WEBHOOK_ALLOW_PRIVATE" not in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("ftp://example.com/hook", "invalid_webhook_url"),
        ("not a url", "invalid_webhook_url"),
        ("https://user:secret@example.com/hook", "invalid_webhook_url"),
        ("http://127.0.0.1:6379/", "webhook_address_not_allowed"),
        ("http://localhost/hook", "webhook_address_not_allowed"),
        ("http://169.254.169.254/latest/meta-data/", "webhook_address_not_allowed"),
        ("http://[::ffff:10.0.0.1]/", "webhook_address_not_allowed"),
    ],
)
def test_a_url_chorus_will_not_call_is_refused(alice: Persona, url: str, code: str) -> None:
    response = create(alice, url=url)
    assert response.status_code == 400
    assert error_code(response) == code
    assert not WebhookEndpoint.objects.exists()


def test_changing_the_url_to_a_private_address_is_refused(alice: Persona) -> None:
    created = create(alice).json()
    response = alice.client.patch(
        f"/v1/webhooks/endpoints/{created['id']}", {"url": "http://10.0.0.1/"}, format="json"
    )
    assert response.status_code == 400
    assert error_code(response) == "webhook_address_not_allowed"
    assert WebhookEndpoint.objects.get().url == URL


def test_unknown_event_types_and_fields_are_refused(alice: Persona) -> None:
    response = create(alice, event_types=["speech.started"])
    assert (response.status_code, error_code(response)) == (400, "unknown_event_type")
    assert response.json()["error"]["details"]["unknown"] == ["speech.started"]
    response = create(alice, event_types=[])
    assert (response.status_code, error_code(response)) == (400, "unknown_event_type")
    response = create(alice, secret="whsec_mine")
    assert (response.status_code, error_code(response)) == (400, "unknown_field")
    assert not WebhookEndpoint.objects.exists()


def test_the_number_of_endpoints_is_capped(alice: Persona, settings: Any) -> None:
    settings.WEBHOOK_MAX_ENDPOINTS = 2
    assert create(alice).status_code == 201
    assert create(alice).status_code == 201
    response = create(alice)
    assert (response.status_code, error_code(response)) == (409, "webhook_endpoints_full")
    assert WebhookEndpoint.objects.count() == 2


def test_a_read_only_key_cannot_change_endpoints(alice: Persona) -> None:
    key, raw = api_key_create(tenant=alice.tenant, name="reader")
    key.scopes = ["read"]
    key.save()
    alice.client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    response = create(alice)
    assert (response.status_code, error_code(response)) == (403, "insufficient_scope")
    assert alice.client.get("/v1/webhooks/endpoints").status_code == 200


def test_another_tenants_endpoints_do_not_exist(alice: Persona, bob: Persona) -> None:
    created = create(alice).json()
    base = f"/v1/webhooks/endpoints/{created['id']}"
    assert bob.client.get("/v1/webhooks/endpoints").json()["results"] == []
    for response in (
        bob.client.get(base),
        bob.client.patch(base, {"enabled": False}, format="json"),
        bob.client.delete(base),
        bob.client.post(f"{base}/rotate-secret"),
        bob.client.get(f"{base}/deliveries"),
    ):
        assert (response.status_code, error_code(response)) == (404, "not_found")
    assert WebhookEndpoint.objects.get().enabled


@pytest.mark.django_db(transaction=True)
def test_deliveries_are_listed_with_their_log_and_can_be_redelivered(
    alice: Persona, bob: Persona, receiver: Receiver, published: Published
) -> None:
    endpoint = endpoint_for(alice, receiver)
    receiver.statuses = [500]
    event = event_publish(tenant_id=alice.tenant.pk, event_type="batch.completed", data={"n": 1})
    assert event is not None
    published.run_next()  # fails; its retry stays queued
    published.calls.clear()

    listed = alice.client.get(f"/v1/webhooks/endpoints/{endpoint.id}/deliveries").json()
    [delivery] = listed["results"]
    assert delivery["webhook_id"] == event.webhook_id
    assert (delivery["event_type"], delivery["status"], delivery["attempts"]) == (
        "batch.completed",
        "pending",
        1,
    )
    [attempt] = delivery["log"]
    assert (attempt["number"], attempt["response_status"], attempt["error"]) == (1, 500, "HTTP 500")
    assert attempt["response_body"] == "answer 500"

    path = f"/v1/webhooks/endpoints/{endpoint.id}/deliveries/{delivery['id']}/redeliver"
    assert bob.client.post(path).status_code == 404
    response = alice.client.post(path)
    assert response.status_code == 202
    again = response.json()
    assert again["id"] != delivery["id"]
    assert again["webhook_id"] == event.webhook_id
    assert [r["status"] for r in published.run_all()] == ["succeeded"]
    assert receiver.received[-1].headers["webhook-id"] == event.webhook_id
    assert WebhookDelivery.objects.filter(status="succeeded").count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_disabled_endpoint_cannot_be_redelivered_to(
    alice: Persona, receiver: Receiver, published: Published
) -> None:
    endpoint = endpoint_for(alice, receiver)
    event_publish(tenant_id=alice.tenant.pk, event_type="batch.completed", data={})
    published.run_all()
    endpoint.enabled = False
    endpoint.save()
    delivery = WebhookDelivery.objects.get()
    response = alice.client.post(
        f"/v1/webhooks/endpoints/{endpoint.id}/deliveries/{delivery.id}/redeliver"
    )
    assert (response.status_code, error_code(response)) == (409, "webhook_endpoint_disabled")
    assert WebhookDelivery.objects.count() == 1
    assert published.calls == []
