"""The operator's admin: every page renders, keys are shown once, tenants get buckets."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from synthesis.models import Job, JobStatus, Priority, Voice
from tenants.models import ApiKey, Plan, Tenant
from tenants.services import tenant_bucket_provision
from tests.conftest import Persona

KEY_IN_TEXT = re.compile(r"ck_[A-Za-z0-9_-]{32,}")


@pytest.fixture
def operator(db: None) -> Client:
    """A staff superuser, logged in to the admin."""
    user = get_user_model().objects.create_superuser("operator", "op@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


def make_voice(persona: Persona, name: str = "Narrator") -> Voice:
    return Voice.objects.create(
        tenant=persona.tenant,
        name=name,
        audio_key=f"voices/{name}/v1/reference.wav",
        audio_format="wav",
        sample_rate=22050,
        channels=1,
        duration_s=4.0,
        size_bytes=1000,
    )


def make_job(persona: Persona, *, status: str = JobStatus.QUEUED, priority: str = "normal") -> Job:
    return Job.objects.create(
        tenant=persona.tenant,
        api_key=persona.api_key,
        text="hello",
        characters=5,
        status=status,
        priority=priority,
    )


def authenticates(raw: str) -> bool:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client.get("/v1/voices").status_code == 200


def listed_job_ids(response: Any) -> set[str]:
    return {str(job.pk) for job in response.context["cl"].result_list}


# --- pages ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url_name",
    [
        "admin:index",
        "admin:tenants_tenant_changelist",
        "admin:tenants_plan_changelist",
        "admin:tenants_apikey_changelist",
        "admin:synthesis_voice_changelist",
        "admin:synthesis_job_changelist",
        "admin:tenants_tenant_add",
        "admin:tenants_plan_add",
        "admin:tenants_apikey_add",
    ],
)
def test_every_admin_page_renders_with_data_in_it(
    operator: Client, alice: Persona, url_name: str
) -> None:
    make_voice(alice)
    make_job(alice, status=JobStatus.FAILED)

    response = operator.get(reverse(url_name))

    assert response.status_code == 200


def test_the_change_pages_of_each_object_render(operator: Client, alice: Persona) -> None:
    voice, job = make_voice(alice), make_job(alice)
    pages = [
        ("tenants_tenant", alice.tenant.pk),
        ("tenants_plan", alice.tenant.plan_id),
        ("tenants_apikey", alice.api_key.pk),
        ("synthesis_voice", voice.pk),
        ("synthesis_job", job.pk),
    ]
    for model, pk in pages:
        response = operator.get(reverse(f"admin:{model}_change", args=[pk]))

        assert response.status_code == 200, model


def test_the_job_list_filters_by_tenant_status_and_priority(
    operator: Client, alice: Persona, bob: Persona
) -> None:
    alice_high = make_job(alice, priority=Priority.HIGH)
    alice_failed = make_job(alice, status=JobStatus.FAILED)
    bob_low = make_job(bob, priority=Priority.LOW, status=JobStatus.SUCCEEDED)
    url = reverse("admin:synthesis_job_changelist")

    by_tenant = operator.get(url, {"tenant__id__exact": alice.tenant.pk})
    by_status = operator.get(url, {"status__exact": "failed"})
    by_priority = operator.get(url, {"priority__exact": "low"})
    combined = operator.get(url, {"tenant__id__exact": alice.tenant.pk, "priority__exact": "high"})

    assert listed_job_ids(by_tenant) == {str(alice_high.pk), str(alice_failed.pk)}
    assert listed_job_ids(by_status) == {str(alice_failed.pk)}
    assert listed_job_ids(by_priority) == {str(bob_low.pk)}
    assert listed_job_ids(combined) == {str(alice_high.pk)}
    assert str(bob_low.pk) in operator.get(url).content.decode()


# --- API keys ---------------------------------------------------------------------


def test_adding_a_key_shows_it_once_and_stores_only_its_hash(
    operator: Client, alice: Persona
) -> None:
    response = operator.post(
        reverse("admin:tenants_apikey_add"),
        {"tenant": alice.tenant.pk, "name": "from the admin", "scopes": ["read", "speech:write"]},
    )

    # Shown in the answer to the POST itself, not through a message read later.
    assert response.status_code == 200
    raws = KEY_IN_TEXT.findall(response.content.decode())
    assert len(raws) == 1
    raw = raws[0]

    key = ApiKey.objects.get(tenant=alice.tenant, name="from the admin")
    assert key.key_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert key.prefix == raw[3:13]
    assert not any(
        raw in str(value) for value in ApiKey.objects.filter(pk=key.pk).values().get().values()
    )
    assert authenticates(raw)

    # Never again: neither the list nor the key's own page shows it.
    assert raw not in operator.get(reverse("admin:tenants_apikey_changelist")).content.decode()
    change = operator.get(reverse("admin:tenants_apikey_change", args=[key.pk]))
    assert raw not in change.content.decode()


def test_the_revoke_action_revokes_the_selected_keys_only(
    operator: Client, alice: Persona, bob: Persona
) -> None:
    response = operator.post(
        reverse("admin:tenants_apikey_changelist"),
        {"action": "revoke", "_selected_action": [alice.api_key.pk]},
        follow=True,
    )

    assert response.status_code == 200
    assert any("Revoked 1 key(s)." in str(m) for m in response.context["messages"])
    alice.api_key.refresh_from_db()
    bob.api_key.refresh_from_db()
    assert alice.api_key.revoked_at is not None
    assert bob.api_key.revoked_at is None
    assert not authenticates(alice.key)
    assert authenticates(bob.key)


def test_revoking_an_already_revoked_key_keeps_its_revocation_time(
    operator: Client, alice: Persona
) -> None:
    url = reverse("admin:tenants_apikey_changelist")
    operator.post(url, {"action": "revoke", "_selected_action": [alice.api_key.pk]})
    alice.api_key.refresh_from_db()
    first = alice.api_key.revoked_at

    response = operator.post(
        url, {"action": "revoke", "_selected_action": [alice.api_key.pk]}, follow=True
    )

    alice.api_key.refresh_from_db()
    assert alice.api_key.revoked_at == first
    assert any("Revoked 0 key(s)." in str(m) for m in response.context["messages"])


# --- tenants ----------------------------------------------------------------------


def tenant_form(plan: Plan, slug: str) -> dict[str, Any]:
    """The admin's add form for a tenant named Globex, with no keys inline."""
    return {
        "slug": slug,
        "name": "Globex",
        "active": "on",
        "plan": plan.pk,
        "api_keys-TOTAL_FORMS": "0",
        "api_keys-INITIAL_FORMS": "0",
        "api_keys-MIN_NUM_FORMS": "0",
        "api_keys-MAX_NUM_FORMS": "1000",
    }


def test_creating_a_tenant_in_the_admin_creates_its_bucket(operator: Client, plan: Plan) -> None:
    response = operator.post(reverse("admin:tenants_tenant_add"), tenant_form(plan, "globex"))

    assert response.status_code == 302, response.content.decode()
    tenant = Tenant.objects.get(slug="globex")
    assert tenant.bucket == "chorus-globex"
    assert (Path(settings.STORAGE["local_root"]) / tenant.bucket).is_dir()


def test_the_admin_refuses_a_tenant_slug_that_cannot_name_a_bucket(
    operator: Client, plan: Plan
) -> None:
    response = operator.post(reverse("admin:tenants_tenant_add"), tenant_form(plan, "Globex_Corp"))

    assert response.status_code == 200
    assert "slug" in response.context["adminform"].form.errors
    assert not Tenant.objects.filter(name="Globex").exists()


# --- who gets in ------------------------------------------------------------------


def test_a_tenant_api_key_does_not_open_the_admin(alice: Persona) -> None:
    client = Client(headers={"Authorization": f"Bearer {alice.key}"})

    for url in ("/admin/", reverse("admin:tenants_tenant_changelist")):
        response = client.get(url)

        assert response.status_code == 302
        assert response["Location"].startswith(reverse("admin:login"))


def test_an_anonymous_visitor_is_sent_to_the_login_page(db: None) -> None:
    response = Client().get("/admin/")

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


@pytest.mark.embedded  # the write lock is the embedded default's
@pytest.mark.django_db(transaction=True)
def test_the_admin_makes_a_new_tenants_bucket_once_and_outside_its_transaction(
    plan: Plan, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the embedded default an open transaction holds the database's write
    lock: a storage server awaited inside it would hold up every worker."""
    made: list[bool] = []

    def recording_provision(*, slug: str) -> str:
        made.append(connection.in_atomic_block)
        return tenant_bucket_provision(slug=slug)

    monkeypatch.setattr("tenants.admin.tenant_bucket_provision", recording_provision)
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("op", "op@example.com", "pw"))
    refused = client.post(reverse("admin:tenants_tenant_add"), tenant_form(plan, "Globex_Corp"))
    added = client.post(reverse("admin:tenants_tenant_add"), tenant_form(plan, "globex"))

    assert refused.status_code == 200  # no bucket for a slug that cannot name one
    assert added.status_code == 302, added.content.decode()
    assert Tenant.objects.get(slug="globex").bucket == "chorus-globex"
    assert made == [False]


@pytest.mark.embedded
def test_a_staff_user_who_may_not_add_tenants_makes_no_bucket(
    plan: Plan, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[str] = []
    monkeypatch.setattr("tenants.admin.tenant_bucket_provision", lambda *, slug: made.append(slug))
    viewer = get_user_model().objects.create_user("viewer", "v@example.com", "pw", is_staff=True)
    client = Client()
    client.force_login(viewer)

    response = client.post(reverse("admin:tenants_tenant_add"), tenant_form(plan, "globex"))

    assert response.status_code == 403
    assert made == []
    assert not Tenant.objects.filter(slug="globex").exists()
