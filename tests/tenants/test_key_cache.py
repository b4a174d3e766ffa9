"""Each web process remembers an authenticated key for API_KEY_CACHE_S seconds."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.utils import timezone

from tenants.models import ApiKey
from tenants.services import api_key_authenticate, api_key_revoke
from tests.conftest import Persona

pytestmark = pytest.mark.django_db


@pytest.fixture
def cache_on(settings: Any) -> None:
    settings.API_KEY_CACHE_S = 5


def test_a_remembered_key_authenticates_without_a_query(
    alice: Persona, cache_on: None, django_assert_num_queries: Any
) -> None:
    first = api_key_authenticate(raw=alice.key)
    with django_assert_num_queries(0):
        again = api_key_authenticate(raw=alice.key)

    assert first is not None
    assert again is not None
    assert again.pk == alice.api_key.pk
    assert again.tenant.pk == alice.tenant.pk


def test_a_key_revoked_in_this_process_is_refused_at_once(alice: Persona, cache_on: None) -> None:
    assert api_key_authenticate(raw=alice.key) is not None

    api_key_revoke(api_key=alice.api_key)

    assert api_key_authenticate(raw=alice.key) is None
    assert alice.client.get("/v1/voices").status_code == 401


def test_a_key_revoked_elsewhere_is_refused_once_the_cache_time_has_passed(
    alice: Persona, settings: Any
) -> None:
    settings.API_KEY_CACHE_S = 0.3
    assert api_key_authenticate(raw=alice.key) is not None
    # Another process revokes it: this one cannot know before its entry expires.
    ApiKey.objects.filter(pk=alice.api_key.pk).update(revoked_at=timezone.now())
    assert api_key_authenticate(raw=alice.key) is not None

    time.sleep(0.35)

    assert api_key_authenticate(raw=alice.key) is None


def test_a_wrong_key_is_looked_up_every_time(
    alice: Persona, cache_on: None, django_assert_num_queries: Any
) -> None:
    wrong = alice.key[:-4] + ("AAAA" if not alice.key.endswith("AAAA") else "BBBB")
    for _ in range(2):
        with django_assert_num_queries(1):
            assert api_key_authenticate(raw=wrong) is None


def test_with_no_cache_time_every_request_looks_the_key_up(
    alice: Persona, django_assert_num_queries: Any
) -> None:
    api_key_authenticate(raw=alice.key)
    with django_assert_num_queries(1):
        assert api_key_authenticate(raw=alice.key) is not None
