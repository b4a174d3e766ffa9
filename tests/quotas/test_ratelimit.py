"""Requests per minute: exact under parallel requests, per tenant and per key."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from chorus.redis_client import get_redis
from quotas.ratelimit import WINDOW_MS, rate_limit_hit
from tenants.models import Plan
from tenants.services import api_key_create
from tests.assertions import assert_error
from tests.conftest import Persona, make_persona

# Ids no test database hands out, so these windows never meet a real tenant's.
TENANT_ID, KEY_ID, OTHER_KEY_ID = 990_001, 990_002, 990_003


def parallel(call: Callable[[], Any], times: int, workers: int = 25) -> list[Any]:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda _: call(), range(times)))


def window_size(name: str) -> int:
    client = get_redis()
    assert client is not None, "tests need REDIS_URL (make test sets it)"
    return int(client.zcard(f"chorus:rl:{name}"))


# --- the limiter itself -----------------------------------------------------------


def test_exactly_the_limit_is_admitted_under_100_parallel_hits() -> None:
    def hit() -> Any:
        return rate_limit_hit(tenant_id=TENANT_ID, key_id=KEY_ID, tenant_limit=30, key_limit=30)

    decisions = parallel(hit, 100)

    allowed = [d for d in decisions if d.allowed]
    print(f"\nrate limiter: {len(allowed)} of 100 parallel hits allowed, limit 30")
    assert len(allowed) == 30
    # Each admitted hit saw a different count: remaining runs 29..0 without repeats.
    assert sorted(d.remaining for d in allowed) == list(range(30))
    assert window_size(f"tenant:{TENANT_ID}") == window_size(f"key:{KEY_ID}") == 30


def test_refused_hits_are_not_recorded_and_do_not_push_the_window_forward() -> None:
    def hit() -> Any:
        return rate_limit_hit(tenant_id=TENANT_ID, key_id=KEY_ID, tenant_limit=5, key_limit=5)

    admitted = [hit() for _ in range(5)]
    client = get_redis()
    assert client is not None
    oldest = client.zrange(f"chorus:rl:tenant:{TENANT_ID}", 0, 0, withscores=True)

    refused = parallel(hit, 50)

    assert all(d.allowed for d in admitted)
    assert not any(d.allowed for d in refused)
    assert window_size(f"tenant:{TENANT_ID}") == window_size(f"key:{KEY_ID}") == 5
    assert client.zrange(f"chorus:rl:tenant:{TENANT_ID}", 0, 0, withscores=True) == oldest
    # The reset points at the oldest admitted request, not at the latest refusal.
    assert all(0 < d.reset_ms <= WINDOW_MS for d in refused)
    assert max(d.reset_ms for d in refused) <= admitted[0].reset_ms


def test_a_keys_own_limit_refuses_only_that_key() -> None:
    def hit(key_id: int, key_limit: int) -> Any:
        return rate_limit_hit(
            tenant_id=TENANT_ID, key_id=key_id, tenant_limit=10, key_limit=key_limit
        )

    small = [hit(KEY_ID, 3) for _ in range(6)]
    other = [hit(OTHER_KEY_ID, 10) for _ in range(10)]

    assert [d.allowed for d in small] == [True] * 3 + [False] * 3
    assert {d.scope for d in small[3:]} == {"key"}
    assert small[3].limit == 3
    # The other key gets the rest of the tenant's 10, then the tenant window refuses.
    assert [d.allowed for d in other] == [True] * 7 + [False] * 3
    assert {(d.scope, d.limit) for d in other[7:]} == {("tenant", 10)}
    assert window_size(f"tenant:{TENANT_ID}") == 10
    assert (window_size(f"key:{KEY_ID}"), window_size(f"key:{OTHER_KEY_ID}")) == (3, 7)


# --- through the API --------------------------------------------------------------


@pytest.fixture
def strict_plan(db: None) -> Plan:
    return Plan.objects.create(name="strict", requests_per_minute=20)


@pytest.fixture
def carol(strict_plan: Plan) -> Persona:
    return make_persona("carol", strict_plan)


@pytest.fixture
def reads_as_strict_as_writes(settings: Any) -> None:
    """The tests of the windows below count reads (GET /v1/usage is the cheapest
    request): here reads get the plan's own limit, not the usual multiple."""
    settings.READ_RATE_MULTIPLIER = 1


def client_for(raw_key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


def get_usage(raw_key: str) -> Any:
    # Each call from its own thread and its own client; the thread's connection
    # is closed at the end, or PostgreSQL keeps it (and the test database) busy.
    try:
        return client_for(raw_key).get("/v1/usage")
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("reads_as_strict_as_writes")
def test_exactly_the_plans_limit_of_parallel_api_requests_get_through(carol: Persona) -> None:
    responses = parallel(lambda: get_usage(carol.key), 60, workers=20)

    ok = [r for r in responses if r.status_code != 429]
    refused = [r for r in responses if r.status_code == 429]
    print(f"\nAPI rate limit: {len(ok)} of 60 parallel requests got through, limit 20")
    assert len(ok) == 20
    assert {r.status_code for r in ok} == {200}
    assert len(refused) == 40
    error = assert_error(refused[0], 429, "rate_limited")
    assert error["details"] == {"limit": 20, "window_seconds": 60, "scope": "tenant"}
    for response in refused:
        assert 1 <= int(response["Retry-After"]) <= 60
        assert response["X-RateLimit-Limit"] == "20"
        assert response["X-RateLimit-Remaining"] == "0"
        assert 1 <= int(response["X-RateLimit-Reset"]) <= 60
    assert sorted(int(r["X-RateLimit-Remaining"]) for r in ok) == list(range(20))
    assert window_size(f"read:tenant:{carol.tenant.pk}") == 20


@pytest.mark.usefixtures("reads_as_strict_as_writes")
def test_successful_responses_count_down_the_remaining_requests(carol: Persona) -> None:
    responses = [carol.client.get("/v1/voices") for _ in range(5)]

    assert [r.status_code for r in responses] == [200] * 5
    assert [r["X-RateLimit-Remaining"] for r in responses] == ["19", "18", "17", "16", "15"]
    assert {r["X-RateLimit-Limit"] for r in responses} == {"20"}
    assert all(1 <= int(r["X-RateLimit-Reset"]) <= 60 for r in responses)


@pytest.mark.usefixtures("reads_as_strict_as_writes")
def test_hammering_after_the_limit_does_not_extend_the_window(carol: Persona) -> None:
    for _ in range(20):
        assert carol.client.get("/v1/usage").status_code == 200

    for _ in range(30):
        assert_error(carol.client.get("/v1/usage"), 429, "rate_limited")

    assert window_size(f"read:tenant:{carol.tenant.pk}") == 20
    assert window_size(f"read:key:{carol.api_key.pk}") == 20


@pytest.mark.usefixtures("reads_as_strict_as_writes")
def test_a_keys_own_limit_applies_to_that_key_only(carol: Persona) -> None:
    carol.api_key.requests_per_minute = 3
    carol.api_key.save(update_fields=["requests_per_minute"])
    _, other_raw = api_key_create(tenant=carol.tenant, name="batch")
    other = client_for(other_raw)

    limited = [carol.client.get("/v1/usage") for _ in range(5)]
    unlimited = [other.get("/v1/usage") for _ in range(20)]

    assert [r.status_code for r in limited] == [200, 200, 200, 429, 429]
    assert [r["X-RateLimit-Remaining"] for r in limited[:3]] == ["2", "1", "0"]
    error = assert_error(limited[3], 429, "rate_limited")
    assert error["details"]["scope"] == "key"
    assert limited[3]["X-RateLimit-Limit"] == "3"
    # The other key shares the tenant's 20: 17 left after the limited key's 3.
    assert [r.status_code for r in unlimited] == [200] * 17 + [429] * 3
    assert assert_error(unlimited[-1], 429, "rate_limited")["details"]["scope"] == "tenant"
    assert unlimited[-1]["X-RateLimit-Limit"] == "20"
    assert window_size(f"read:tenant:{carol.tenant.pk}") == 20


@pytest.mark.usefixtures("reads_as_strict_as_writes")
def test_one_tenants_limit_does_not_touch_another_tenants(
    carol: Persona, strict_plan: Plan
) -> None:
    dave = make_persona("dave", strict_plan)
    for _ in range(25):
        carol.client.get("/v1/usage")

    response = dave.client.get("/v1/usage")

    assert response.status_code == 200
    assert response["X-RateLimit-Remaining"] == "19"


def test_reads_have_their_own_larger_window_and_never_use_up_writes(
    carol: Persona, settings: Any
) -> None:
    settings.READ_RATE_MULTIPLIER = 10
    missing = "/v1/speech/00000000-0000-0000-0000-000000000000/cancel"

    polls = [carol.client.get("/v1/usage") for _ in range(25)]  # past the plan's 20
    writes = [carol.client.post(missing) for _ in range(21)]
    poll_after = carol.client.get("/v1/usage")

    assert [r.status_code for r in polls] == [200] * 25
    assert {r["X-RateLimit-Limit"] for r in polls} == {"200"}
    assert polls[-1]["X-RateLimit-Remaining"] == "175"
    # The 25 reads took nothing from the 20 writes a minute: the job 404s are writes.
    assert [r.status_code for r in writes] == [404] * 20 + [429]
    assert writes[0]["X-RateLimit-Limit"] == "20"
    assert_error(writes[-1], 429, "rate_limited")
    # And 20 writes, one refused, take nothing from the reads.
    assert poll_after.status_code == 200
    assert poll_after["X-RateLimit-Remaining"] == "174"
    assert window_size(f"tenant:{carol.tenant.pk}") == 20
    assert window_size(f"read:tenant:{carol.tenant.pk}") == 26
