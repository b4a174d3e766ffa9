"""Operators see each delivery's log and can send deliveries again from the admin."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client

from tests.conftest import Persona
from tests.webhooks.conftest import Published, endpoint_for
from tests.webhooks.receiver import Receiver
from webhooks.addresses import url_check
from webhooks.events import event_publish
from webhooks.models import WebhookDelivery
from webhooks.services.endpoints import endpoint_create

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def operator() -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("op", "op@example.com", "pw"))
    return client


def test_the_redeliver_action_sends_the_event_again_with_its_id(
    alice: Persona, receiver: Receiver, published: Published, operator: Client
) -> None:
    endpoint_for(alice, receiver)
    receiver.statuses = [500]
    event = event_publish(tenant_id=alice.tenant.pk, event_type="batch.completed", data={})
    assert event is not None
    published.run_next()
    published.calls.clear()
    delivery = WebhookDelivery.objects.get()

    page = operator.get(f"/admin/webhooks/webhookdelivery/{delivery.pk}/change/")
    assert page.status_code == 200
    assert b"answer 500" in page.content  # the attempt's logged response
    response = operator.post(
        "/admin/webhooks/webhookdelivery/",
        {"action": "redeliver", "_selected_action": [str(delivery.pk)]},
    )
    assert response.status_code == 302
    assert [r["status"] for r in published.run_all()] == ["succeeded"]
    assert [r.headers["webhook-id"] for r in receiver.received] == [event.webhook_id] * 2
    assert WebhookDelivery.objects.count() == 2


def test_an_endpoint_added_in_the_admin_gets_a_secret_and_a_checked_url(
    alice: Persona, operator: Client, settings: Any
) -> None:
    data = {"tenant": alice.tenant.pk, "event_types": ["speech.failed"], "enabled": "on"}
    refused = operator.post(
        "/admin/webhooks/webhookendpoint/add/", {**data, "url": "http://10.0.0.1/hook"}
    )
    assert refused.status_code == 200
    assert b"private address" in refused.content
    added = operator.post(
        "/admin/webhooks/webhookendpoint/add/", {**data, "url": "https://hooks.example.invalid/"}
    )
    assert added.status_code == 302
    endpoint = alice.tenant.webhook_endpoints.get()
    assert endpoint.secret.startswith("whsec_")


@pytest.mark.embedded  # the write lock is the embedded default's
def test_the_admin_resolves_an_endpoints_host_once_and_outside_its_transaction(
    alice: Persona, operator: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the embedded default an open transaction holds the database's write
    lock: a DNS answer awaited inside it would hold up every worker."""
    checks: list[bool] = []

    def recording_check(url: str) -> None:
        checks.append(connection.in_atomic_block)
        url_check(url)

    monkeypatch.setattr("webhooks.admin.url_check", recording_check)
    data = {"tenant": alice.tenant.pk, "event_types": ["speech.failed"], "enabled": "on"}
    refused = operator.post(
        "/admin/webhooks/webhookendpoint/add/", {**data, "url": "http://10.0.0.1/hook"}
    )
    assert b"private address" in refused.content
    added = operator.post(
        "/admin/webhooks/webhookendpoint/add/", {**data, "url": "https://hooks.example.invalid/"}
    )
    assert added.status_code == 302
    endpoint = alice.tenant.webhook_endpoints.get()
    changed = operator.post(
        f"/admin/webhooks/webhookendpoint/{endpoint.pk}/change/",
        {**data, "url": "https://other.example.invalid/"},
    )
    assert changed.status_code == 302
    endpoint.refresh_from_db()
    assert endpoint.url == "https://other.example.invalid/"
    assert checks == [False, False, False]  # one check per POST, none in a transaction


@pytest.mark.embedded  # the redrawn page follows a rolled-back transaction
def test_an_endpoint_added_in_the_admin_over_the_cap_is_refused_on_the_form(
    alice: Persona, operator: Client, settings: Any
) -> None:
    settings.WEBHOOK_MAX_ENDPOINTS = 1
    endpoint_create(tenant=alice.tenant, url="https://hooks.example.invalid/first")
    data = {"tenant": alice.tenant.pk, "event_types": ["speech.failed"], "enabled": "on"}

    response = operator.post(
        "/admin/webhooks/webhookendpoint/add/", {**data, "url": "https://hooks.example.invalid/"}
    )

    assert response.status_code == 200
    assert response.context["adminform"].form.non_field_errors() == [
        "You have 1 webhook endpoints, the most allowed; delete one first."
    ]
    assert [e.url for e in alice.tenant.webhook_endpoints.all()] == [
        "https://hooks.example.invalid/first"
    ]


def test_an_endpoint_stays_with_its_tenant_when_changed_in_the_admin(
    alice: Persona, bob: Persona, operator: Client
) -> None:
    endpoint = endpoint_create(tenant=alice.tenant, url="https://hooks.example.invalid/")

    response = operator.post(
        f"/admin/webhooks/webhookendpoint/{endpoint.pk}/change/",
        {
            "tenant": bob.tenant.pk,
            "url": "https://hooks.example.invalid/",
            "event_types": ["batch.completed"],
        },
    )

    assert response.status_code == 302
    endpoint.refresh_from_db()
    assert (endpoint.tenant, endpoint.event_types, endpoint.enabled) == (
        alice.tenant,
        ["batch.completed"],
        False,
    )
