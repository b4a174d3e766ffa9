"""Body limits per route and plan under the real web server (uvicorn, the ASGI
middleware in front of Django): an enterprise batch over 1 MiB is admitted, a 10 MB
text is refused 413 `longform_text_too_long` as soon as its length is declared.
Before, both answered 400 `bad_request` (Django's 1 MiB cap on a JSON body)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from synthesis.models import Job
from tenants.models import Plan
from tests.conftest import make_persona
from tests.e2e.asgi import AsgiServer, asgi_server  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.embedded, pytest.mark.django_db(transaction=True)]


def test_the_web_server_admits_what_the_plan_allows_and_refuses_more_with_its_code(
    asgi_server: Callable[..., AsgiServer],  # noqa: F811
    broker: Any,
) -> None:
    plan = Plan.objects.create(
        name="big",
        monthly_characters=50_000_000,
        max_text_chars=5_000,
        max_longform_chars=100_000,
        requests_per_minute=3_000,
        batch_max_items=5_000,
        batch_max_characters=5_000_000,
    )
    erin = make_persona("erin", plan)
    server = asgi_server()
    batch = json.dumps({"items": [{"text": f"Item {n}. " + "a" * 4_990} for n in range(220)]})
    assert len(batch) > 1024 * 1024
    with httpx.Client(
        base_url=server.url,
        headers={"Authorization": f"Bearer {erin.key}", "Content-Type": "application/json"},
        timeout=60,
    ) as http:
        admitted = http.post("/v1/batches", content=batch)
        refused = http.post("/v1/speech", content=json.dumps({"text": "Say it. " * 1_250_000}))

    assert admitted.status_code == 202, admitted.text[:300] + "".join(server.lines[-20:])
    assert Job.objects.filter(tenant=erin.tenant).count() == 220
    assert refused.status_code == 413, refused.text[:300]
    error = refused.json()["error"]
    assert error["code"] == "longform_text_too_long"
    assert error["details"]["limit_bytes"] == 100_000 * 6 + 4 * 1024
