"""Shared fixtures: personas (alice, and bob the outsider), isolated storage, broker.

Tests run against PostgreSQL and Redis (`make test` points DATABASE_URL and
REDIS_URL at them); storage is a fresh local folder per test unless a test
switches to the S3 server on loopback.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from django.conf import settings as django_settings
from rest_framework.test import APIClient

from chorus.redis_client import get_redis, redis_failures_forget
from synthesis.engines import load_engine
from synthesis.engines.base import Engine
from tenants.key_cache import key_cache_clear
from tenants.models import ApiKey, Plan, Tenant
from tenants.services import api_key_create, tenant_create

pytest_plugins = ["tests.leftovers"]


@pytest.fixture(autouse=True)
def _isolated_storage(settings: Any, tmp_path: Any) -> None:
    settings.STORAGE = {
        **settings.STORAGE,
        "backend": "local",
        "local_root": str(tmp_path / "storage"),
        "base_url": "http://testserver",
    }


@pytest.fixture(autouse=True)
def _api_keys_looked_up_every_time(settings: Any) -> Iterator[None]:
    """Tests change keys, tenants and plans between requests and expect the next
    request to see it; the key cache's own tests turn it on."""
    settings.API_KEY_CACHE_S = 0
    key_cache_clear()
    yield
    key_cache_clear()


@pytest.fixture(autouse=True)
def _fresh_rate_windows() -> None:
    """Rate windows are keyed by row ids, which a new test database reuses; and
    a Redis failure an earlier test provoked is forgotten."""
    redis_failures_forget()
    client = get_redis()
    if client is not None:
        for key in client.scan_iter("chorus:rl:*"):
            client.delete(key)


@dataclass
class Persona:
    tenant: Tenant
    key: str
    api_key: ApiKey
    client: APIClient


def make_persona(slug: str, plan: Plan | None = None) -> Persona:
    tenant = tenant_create(slug=slug, name=slug.title(), plan=plan)
    api_key, raw = api_key_create(tenant=tenant, name=f"{slug} key")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return Persona(tenant=tenant, key=raw, api_key=api_key, client=client)


@pytest.fixture
def plan(db: None) -> Plan:
    """Roomy limits, so a test meets only the limit it sets itself."""
    return Plan.objects.create(
        name="standard",
        monthly_characters=10_000_000,
        requests_per_minute=100_000,
        max_concurrent_jobs=1_000,
        voice_slots=1_000,
    )


@pytest.fixture
def alice(plan: Plan) -> Persona:
    return make_persona("alice", plan)


@pytest.fixture
def bob(plan: Plan) -> Persona:
    """The outsider: another tenant who must never see alice's objects."""
    return make_persona("bob", plan)


@pytest.fixture
def anonymous() -> APIClient:
    return APIClient()


@pytest.fixture
def engine(tmp_path: Any) -> Iterator[Engine]:
    """The synthetic engine as a worker loads it, minus the emulated delays."""
    loaded = load_engine(
        "synthetic",
        {"first_chunk_delay_s": 0.0, "rtf": 0.0, "state_dir": str(tmp_path / "device")},
    )
    yield loaded
    loaded.close()


@pytest.fixture
def broker() -> Iterator[redis.Redis]:
    """The real Redis the job queues live in, with the synth queues emptied."""
    assert django_settings.REDIS_URL, "tests need REDIS_URL (make test sets it)"
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    client.delete(*django_settings.SYNTH_QUEUES)
    yield client
    client.delete(*django_settings.SYNTH_QUEUES)
    client.close()
