"""Audit events cannot be changed or deleted, in the admin or (on PostgreSQL) by
SQL; only the sweeper's prune deletes them, past each plan's retention."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import DatabaseError, connection, transaction
from django.test import Client
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import audit_prune
from synthesis.services.sweeper import sweep
from tenants.models import Plan
from tests.conftest import Persona, make_persona


def _age(event: AuditEvent, days: int) -> None:
    """Backdate an event, as time would: PostgreSQL's triggers are off for the
    statement (a superuser's replica role; the tests connect as one)."""
    postgresql = connection.vendor == "postgresql"
    with connection.cursor() as cursor:
        if postgresql:
            cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute(
            "UPDATE audit_auditevent SET created_at = %s WHERE id = %s",
            [timezone.now() - timedelta(days=days), event.id if postgresql else event.id.hex],
        )
        if postgresql:
            cursor.execute("SET LOCAL session_replication_role = origin")


def test_postgresql_refuses_a_raw_update_or_delete_of_an_event(alice: Persona) -> None:
    assert connection.vendor == "postgresql"  # the PostgreSQL pass; SQLite has no trigger
    event = AuditEvent.objects.filter(tenant=alice.tenant).first()
    assert event is not None

    for sql in (
        "UPDATE audit_auditevent SET actor = 'nobody' WHERE id = %s",
        "DELETE FROM audit_auditevent WHERE id = %s",
    ):
        with (
            pytest.raises(DatabaseError, match="append-only"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute(sql, [event.id])

    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).delete()
    event.refresh_from_db()
    assert event.actor == "system"


@pytest.mark.embedded
def test_the_sweeper_prunes_events_past_the_plans_retention_and_keeps_the_rest(
    alice: Persona, plan: Plan
) -> None:
    short = Plan.objects.create(name="short", audit_retention_days=30)
    bob = make_persona("bob", short)
    alice_old = AuditEvent.objects.filter(tenant=alice.tenant).first()
    bob_old, bob_recent = AuditEvent.objects.filter(tenant=bob.tenant).order_by("created_at")
    assert alice_old is not None
    _age(alice_old, 40)  # alice's plan keeps 365 days
    _age(bob_old, 40)  # bob's keeps 30
    _age(bob_recent, 20)

    report = sweep()

    assert report.audit_pruned == 1
    assert not AuditEvent.objects.filter(pk=bob_old.pk).exists()
    assert AuditEvent.objects.filter(pk__in=[alice_old.pk, bob_recent.pk]).count() == 2


@pytest.mark.embedded
def test_the_prune_goes_in_bounded_batches(plan: Plan) -> None:
    short = Plan.objects.create(name="short", audit_retention_days=1)
    for n in range(5):
        make_persona(f"t{n}", short)  # two events each: tenant and key
    for event in AuditEvent.objects.all():
        _age(event, 2)

    assert audit_prune(limit=4) == 4
    assert audit_prune(limit=4) == 4
    assert audit_prune(limit=4) == 2
    assert audit_prune(limit=4) == 0


@pytest.mark.embedded
def test_the_admin_shows_events_and_offers_no_way_to_change_or_delete_them(
    alice: Persona,
) -> None:
    user = get_user_model().objects.create_superuser("operator", "op@example.com", "pw")
    client = Client()
    client.force_login(user)
    event = AuditEvent.objects.filter(tenant=alice.tenant).first()
    assert event is not None

    listing = client.get("/admin/audit/auditevent/")
    page = client.get(f"/admin/audit/auditevent/{event.pk}/change/")
    changed = client.post(f"/admin/audit/auditevent/{event.pk}/change/", {"actor": "x"})
    deleted = client.post(f"/admin/audit/auditevent/{event.pk}/delete/", {"post": "yes"})
    added = client.get("/admin/audit/auditevent/add/")

    assert listing.status_code == 200
    assert event.type.encode() in listing.content
    assert page.status_code == 200  # a view-only page
    assert b'name="actor"' not in page.content
    assert changed.status_code == 403
    assert deleted.status_code == 403
    assert added.status_code == 403
    event.refresh_from_db()
    assert event.actor == "system"
