"""Endpoint secrets are sealed at rest (chorus.sealing): the database never holds
one in the clear, a former CHORUS_SECRET_KEY still opens them while it is listed
in CHORUS_SECRET_KEY_FALLBACKS, and without it a delivery fails its attempt
rather than go out unsigned. The migration seals the secrets already kept."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from chorus.sealing import SealBroken, unseal
from tests.conftest import Persona
from tests.webhooks.conftest import Published, endpoint_for
from tests.webhooks.receiver import Receiver
from webhooks.events import event_publish
from webhooks.models import WebhookAttempt, WebhookEndpoint

pytestmark = pytest.mark.django_db(transaction=True)


def _row_text(endpoint_id: Any) -> str:
    """Every column of the endpoint's row, as the database holds it."""
    row = WebhookEndpoint.objects.filter(pk=endpoint_id).values().get()
    return " ".join(str(value) for value in row.values())


def test_the_database_never_holds_a_secret_in_the_clear(alice: Persona) -> None:
    created = alice.client.post(
        "/v1/webhooks/endpoints", {"url": "https://hooks.example.com/chorus"}, format="json"
    )
    assert created.status_code == 201, created.json()
    secret = created.json()["secret"]
    rotated = alice.client.post(f"/v1/webhooks/endpoints/{created.json()['id']}/rotate-secret")
    new_secret = rotated.json()["secret"]

    row = _row_text(created.json()["id"])

    assert secret.startswith("whsec_")
    assert new_secret != secret
    assert "whsec_" not in row
    assert secret[6:] not in row
    assert new_secret[6:] not in row
    assert WebhookEndpoint.objects.get(pk=created.json()["id"]).secret == new_secret


def test_a_former_key_opens_secrets_while_it_is_a_fallback(
    alice: Persona, receiver: Receiver, published: Published, settings: Any
) -> None:
    endpoint = endpoint_for(alice, receiver)
    secret = endpoint.secret
    former = settings.SECRET_KEY

    settings.SECRET_KEY = "a-new-key-" + "x" * 40
    settings.SECRET_KEY_FALLBACKS = [former]
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).secret == secret

    settings.SECRET_KEY_FALLBACKS = []
    with pytest.raises(SealBroken):
        _ = WebhookEndpoint.objects.get(pk=endpoint.pk).secret


def test_a_secret_no_key_opens_fails_the_attempt_and_sends_nothing(
    alice: Persona, receiver: Receiver, published: Published, settings: Any
) -> None:
    endpoint_for(alice, receiver)
    settings.SECRET_KEY = "a-new-key-" + "x" * 40  # the former one not kept

    event_publish(tenant_id=alice.tenant.pk, event_type="batch.completed", data={"id": "b"})
    result = published.run_next()

    assert result["status"] == "retrying"  # on the schedule
    assert len(published.calls) == 1  # the retry, queued
    assert receiver.received == []
    [attempt] = WebhookAttempt.objects.all()
    assert not attempt.succeeded
    assert "CHORUS_SECRET_KEY_FALLBACKS" in attempt.error


def test_the_migration_seals_the_secrets_kept_in_the_clear(alice: Persona) -> None:
    executor = MigrationExecutor(connection)
    before = [("webhooks", "0001_initial")]
    executor.migrate(before)
    try:
        old = executor.loader.project_state(before).apps.get_model("webhooks", "WebhookEndpoint")
        clear = "whsec_" + "Q" * 43 + "="
        kept = old.objects.create(
            tenant_id=alice.tenant.pk, url="https://hooks.example.com/", secret=clear
        )
    finally:
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes("webhooks"))

    sealed = WebhookEndpoint.objects.get(pk=kept.pk)
    assert sealed.secret == clear
    assert unseal(sealed.secret_sealed) == clear
    assert "whsec_" not in _row_text(kept.pk)
