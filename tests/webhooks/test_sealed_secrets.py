"""Endpoint secrets are sealed at rest (chorus.sealing): the database never holds
one in the clear, a former CHORUS_SECRET_KEY still opens them while it is listed
in CHORUS_SECRET_KEY_FALLBACKS, and without it a delivery fails its attempt
rather than go out unsigned. The migration seals the secrets already kept;
`manage.py reseal_secrets` seals them all under a new key, so the former one can
be dropped."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from chorus.sealing import SealBroken, reseal, unseal
from tests.conftest import Persona
from tests.webhooks.conftest import Published, endpoint_for
from tests.webhooks.receiver import Receiver
from webhooks.events import event_publish
from webhooks.models import WebhookAttempt, WebhookEndpoint
from webhooks.services import endpoints
from webhooks.services.endpoints import endpoint_rotate_secret

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


NEW_KEY = "a-new-key-" + "x" * 40


def _reseal_secrets(*options: str) -> str:
    out = StringIO()
    call_command("reseal_secrets", *options, stdout=out)
    return out.getvalue().strip()


def test_reseal_seals_every_secret_under_the_new_key(
    alice: Persona, receiver: Receiver, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(endpoints, "RESEAL_PAGE", 2)  # three endpoints: two pages
    made = [endpoint_for(alice, receiver) for _ in range(3)]
    secrets = {endpoint.pk: endpoint.secret for endpoint in made}
    sealed_before = dict(WebhookEndpoint.objects.values_list("pk", "secret_sealed"))
    settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
    settings.SECRET_KEY = NEW_KEY

    assert _reseal_secrets("--dry-run") == (
        "3 would be resealed, 0 already under the current key, 0 that no configured key opens"
    )
    assert dict(WebhookEndpoint.objects.values_list("pk", "secret_sealed")) == sealed_before
    assert _reseal_secrets() == (
        "3 resealed, 0 already under the current key, 0 that no configured key opens"
    )

    settings.SECRET_KEY_FALLBACKS = []  # the former key dropped
    for endpoint in WebhookEndpoint.objects.all():
        assert endpoint.secret == secrets[endpoint.pk]
    assert _reseal_secrets() == (
        "0 resealed, 3 already under the current key, 0 that no configured key opens"
    )


def test_reseal_names_the_secrets_no_key_opens_and_reseals_the_rest(
    alice: Persona, receiver: Receiver, settings: Any
) -> None:
    former = settings.SECRET_KEY
    kept = endpoint_for(alice, receiver)
    kept_secret = kept.secret
    lost = endpoint_for(alice, receiver)
    settings.SECRET_KEY = "a-key-since-forgotten-" + "y" * 30
    lost.secret = "whsec_" + "L" * 43 + "="
    lost.save(update_fields=["secret_sealed"])
    lost_sealed = lost.secret_sealed
    settings.SECRET_KEY = NEW_KEY
    settings.SECRET_KEY_FALLBACKS = [former]

    with pytest.raises(CommandError) as refused:
        _reseal_secrets()

    assert str(lost.pk) in str(refused.value)
    assert str(kept.pk) not in str(refused.value)
    settings.SECRET_KEY_FALLBACKS = []
    assert WebhookEndpoint.objects.get(pk=kept.pk).secret == kept_secret
    assert WebhookEndpoint.objects.get(pk=lost.pk).secret_sealed == lost_sealed  # left as is


def test_reseal_never_puts_back_a_secret_rotated_meanwhile(
    alice: Persona, receiver: Receiver, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = endpoint_for(alice, receiver)
    settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
    settings.SECRET_KEY = NEW_KEY
    rotated: list[str] = []

    def rotate_then_reseal(sealed: str) -> str | None:
        # The tenant rotates between the command's read and its write.
        row = WebhookEndpoint.objects.get(pk=endpoint.pk)
        rotated.append(endpoint_rotate_secret(tenant=alice.tenant, endpoint=row).secret)
        return reseal(sealed)

    monkeypatch.setattr(endpoints, "reseal", rotate_then_reseal)

    assert _reseal_secrets() == (
        "0 resealed, 1 already under the current key, 0 that no configured key opens"
    )
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).secret == rotated[0]
