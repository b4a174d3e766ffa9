"""`manage.py create_tenant`: a tenant, its bucket and a first key that works."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from tenants.models import ApiKey, Plan, Tenant


def create_tenant(*args: str) -> str:
    out = io.StringIO()
    call_command("create_tenant", *args, stdout=out)
    return out.getvalue().strip()


def bucket_dir(bucket: str) -> Path:
    return Path(settings.STORAGE["local_root"]) / bucket


@pytest.mark.django_db
def test_it_prints_a_key_that_authenticates_as_the_new_tenant() -> None:
    raw = create_tenant("acme", "--name", "Acme Corp")

    assert re.fullmatch(r"ck_[A-Za-z0-9_-]{32,}", raw)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    response = client.get("/v1/voices")
    assert response.status_code == 200
    assert response.json()["count"] == 0
    tenant = Tenant.objects.get(slug="acme")
    assert tenant.name == "Acme Corp"
    assert ApiKey.objects.get(tenant=tenant).last_used_at is not None


@pytest.mark.django_db
def test_it_creates_the_tenants_bucket() -> None:
    create_tenant("acme")

    tenant = Tenant.objects.get(slug="acme")
    assert tenant.bucket == "chorus-acme"
    assert bucket_dir(tenant.bucket).is_dir()


@pytest.mark.django_db
def test_it_puts_the_tenant_on_the_free_plan_unless_told_otherwise() -> None:
    create_tenant("acme")
    create_tenant("globex", "--plan", "pro")

    assert Tenant.objects.get(slug="acme").plan.name == "free"
    assert Tenant.objects.get(slug="globex").plan == Plan.objects.get(name="pro")


@pytest.mark.django_db
def test_it_refuses_an_unknown_plan_and_creates_nothing() -> None:
    with pytest.raises(CommandError, match=r"No plan named 'platinum'.*pro"):
        create_tenant("acme", "--plan", "platinum")

    assert not Tenant.objects.filter(slug="acme").exists()
    assert not bucket_dir("chorus-acme").exists()


@pytest.mark.django_db
def test_it_refuses_a_slug_that_is_already_taken() -> None:
    create_tenant("acme")

    with pytest.raises(CommandError, match="already exists"):
        create_tenant("acme")

    assert Tenant.objects.filter(slug="acme").count() == 1
    assert ApiKey.objects.filter(tenant__slug="acme").count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("slug", ["Acme", "acme_corp", "acme-", "ac me", "acme.corp"])
def test_it_refuses_a_slug_that_cannot_name_a_bucket_and_creates_nothing(slug: str) -> None:
    with pytest.raises(CommandError, match="lowercase letters, digits and dashes"):
        create_tenant(slug)

    assert not Tenant.objects.exists()
    assert not ApiKey.objects.exists()
    root = Path(settings.STORAGE["local_root"])
    assert not root.exists() or not any(root.iterdir())
