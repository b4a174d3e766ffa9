"""The demo key `make run` prints: the same one while it works, never piling up."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from quotas.plans import tenant_limits
from tenants.demo import DEMO_KEY_NAME, DEMO_SLUG, demo_tenant_key
from tenants.models import ApiKey
from tenants.services import api_key_authenticate, api_key_revoke

pytestmark = pytest.mark.django_db


def live_demo_keys() -> int:
    return ApiKey.objects.filter(
        tenant__slug=DEMO_SLUG, name=DEMO_KEY_NAME, revoked_at__isnull=True
    ).count()


def test_every_run_prints_the_same_working_key(tmp_path: Path) -> None:
    key_file = tmp_path / "demo-key"

    first = demo_tenant_key(key_file=key_file)
    again = [demo_tenant_key(key_file=key_file) for _ in range(3)]

    assert again == [first] * 3
    assert api_key_authenticate(raw=first) is not None
    assert live_demo_keys() == 1
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


def test_the_demo_tenant_can_take_a_ten_user_load_test(tmp_path: Path) -> None:
    key = api_key_authenticate(raw=demo_tenant_key(key_file=tmp_path / "demo-key"))

    assert key is not None
    limits = tenant_limits(key.tenant)
    assert limits.max_concurrent_jobs >= 10
    assert limits.requests_per_minute >= 10 * 20  # ten users' submits, each under 3 s


def test_a_revoked_demo_key_is_replaced_and_stale_ones_revoked(tmp_path: Path) -> None:
    key_file = tmp_path / "demo-key"
    first = demo_tenant_key(key_file=key_file)
    key = api_key_authenticate(raw=first)
    assert key is not None
    api_key_revoke(api_key=key)

    second = demo_tenant_key(key_file=key_file)

    assert second != first
    assert api_key_authenticate(raw=second) is not None
    assert key_file.read_text().strip() == second


def test_a_lost_key_file_leaves_one_live_demo_key(tmp_path: Path) -> None:
    earlier = demo_tenant_key(key_file=tmp_path / "one")

    newer = demo_tenant_key(key_file=tmp_path / "other")

    assert newer != earlier
    assert api_key_authenticate(raw=earlier) is None  # rotated, not accumulated
    assert live_demo_keys() == 1
