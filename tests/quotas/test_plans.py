"""A plan's limits are the plan's own, whatever it is called."""

from __future__ import annotations

from typing import Any

import pytest

from batches.models import Batch
from quotas.plans import BatchLimits, tenant_batch_limits
from tenants.models import Plan, Tenant
from tests.batches.conftest import submit
from tests.conftest import make_persona

pytestmark = pytest.mark.embedded


def _items(n: int) -> list[dict[str, Any]]:
    return [{"text": f"Item number {i}."} for i in range(n)]


@pytest.mark.django_db
def test_the_seeded_plans_keep_their_batch_limits() -> None:
    limits = {plan.name: tenant_batch_limits(Tenant(plan=plan)) for plan in Plan.objects.all()}

    assert limits == {
        "free": BatchLimits(max_items=100, max_characters=20_000),
        "pro": BatchLimits(max_items=1_000, max_characters=500_000),
        "enterprise": BatchLimits(max_items=5_000, max_characters=5_000_000),
    }


@pytest.mark.django_db(transaction=True)
def test_a_plan_an_operator_adds_gets_its_own_batch_limits(broker: Any) -> None:
    studio = Plan.objects.create(
        name="studio", monthly_characters=10**7, batch_max_items=150, batch_max_characters=4_000
    )
    carol = make_persona("carol", studio)

    admitted = submit(carol, _items(120))  # more than the free tier's 100
    too_many = submit(carol, _items(151))
    too_long = submit(carol, [{"text": "y" * 290} for _ in range(14)])  # 4,060 characters

    assert admitted.status_code == 202, admitted.json()
    assert too_many.status_code == 422
    assert too_many.json()["error"]["code"] == "batch_too_large"
    assert too_many.json()["error"]["details"]["limit"] == 150
    assert too_long.status_code == 422
    assert too_long.json()["error"]["details"]["limit"] == 4_000
    assert Batch.objects.filter(tenant=carol.tenant).count() == 1
