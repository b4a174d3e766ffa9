"""The admin's pages fit the screens operators use, in a real browser: no column
of the Workers table or of webhook deliveries past the edge of a 1280 px or
1920 px window, a worker's last error on screen, the 30-day chart's dates
apart from each other; and the API docs page names every webhook event."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from synthesis.engines.base import EngineInfo
from synthesis.heartbeat import Heartbeat
from synthesis.models import WorkerHeartbeat
from tests.browser.conftest import BrowserPage, screenshot
from tests.browser.test_admin_in_a_browser import PASSWORD, log_in
from tests.conftest import Persona
from tests.e2e.asgi import AsgiServer
from webhooks.events import event_publish
from webhooks.models import EVENT_TYPES
from webhooks.services.endpoints import endpoint_create

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

WIDTHS = (1280, 1920)
# What a GPU pool in Kubernetes reports: long pod and node names, a long error.
LONG_ERROR = (
    "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 22.19 GiB total capacity; "
    "19.87 GiB already allocated; 1.21 GiB free; 20.02 GiB reserved in total by PyTorch) "
    "while running flow.inference for job 0f4317a7-bc05-40fa-9159-06d1b5830df2"
)
LONG_URL = (
    "https://hooks.example.invalid/api/v2/integrations/chorus-text-to-speech/"
    "webhooks/receive-and-forward?source=chorus&environment=production"
)


@pytest.fixture
def crowded(alice: Persona) -> Persona:
    """Three GPU workers with long names and errors, and deliveries to a long URL."""
    info = EngineInfo(
        name="cosyvoice2", sample_rate=24000, device="cuda:0 NVIDIA A10G", memory_bytes=2**33
    )
    for n in range(3):
        name = f"gpu@chorus-worker-gpu-a10-normal-7c9f8d6b5-x{n}q2z:{4100 + n}"
        node = f"ip-10-0-{n}-17.eu-west-1.compute.internal"
        Heartbeat(
            name=name, info=info, slots=6, node=node, queues=("synth.high", "synth.normal")
        ).beat()
        WorkerHeartbeat.objects.filter(name=name).update(
            last_error=LONG_ERROR, jobs_done=123456, jobs_failed=789
        )
    endpoint_create(tenant=alice.tenant, url=LONG_URL)
    for n in range(3):
        event_publish(tenant_id=alice.tenant.pk, event_type="batch.completed", data={"id": n})
    get_user_model().objects.create_superuser("operator", "op@example.com", PASSWORD)
    return alice


@pytest.fixture
def logged_in(
    crowded: Persona,
    asgi_server: Callable[..., AsgiServer],
    open_browser: Callable[[], BrowserPage],
) -> tuple[AsgiServer, BrowserPage]:
    """The server over the crowded data, and the operator logged in to its admin."""
    server = asgi_server()
    browser = open_browser()
    log_in(browser, server)
    return server, browser


def _overflow(page: Any, selector: str) -> int:
    """How many pixels the element's content is wider than its box."""
    return int(page.eval_on_selector(selector, "e => e.scrollWidth - e.clientWidth"))


def _right_edge(page: Any, selector: str) -> float:
    return float(page.eval_on_selector(selector, "e => e.getBoundingClientRect().right"))


def test_the_workers_table_fits_the_window_with_each_workers_last_error_on_screen(
    logged_in: tuple[AsgiServer, BrowserPage],
) -> None:
    server, browser = logged_in
    page = browser.page
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 1000})
        page.goto(f"{server.url}/admin/")
        shot = screenshot(page, f"overview-{width}")
        assert _overflow(page, "#overview-workers") <= 0, f"{width} px: scrolls ({shot})"
        assert _overflow(page, "html") <= 0, f"{width} px: the page scrolls sideways ({shot})"
        errors = page.locator("#overview-workers tr.last-error")
        assert errors.count() == 3
        for i in range(3):
            box = errors.nth(i).bounding_box()
            assert box is not None
            assert box["x"] >= 0, shot
            assert box["x"] + box["width"] <= width, shot
            assert "CUDA out of memory" in errors.nth(i).inner_text()
    assert not browser.problems, browser.problems


def test_the_tenant_charts_dates_do_not_overlap(
    crowded: Persona, logged_in: tuple[AsgiServer, BrowserPage]
) -> None:
    server, browser = logged_in
    page = browser.page
    page.goto(f"{server.url}/admin/tenants/tenant/{crowded.tenant.pk}/change/")
    boxes = page.eval_on_selector_all(
        'svg[aria-label="characters per day"] text[y="116"]',
        "texts => texts.map(t => { const r = t.getBoundingClientRect();"
        " return [r.left, r.right, t.textContent]; })",
    )
    chart = page.locator('svg[aria-label="characters per day"]').bounding_box()
    assert chart is not None
    assert len(boxes) == 5  # the first day, every seventh, today
    boxes.sort()
    for (_, right, text), (left, _, following) in itertools.pairwise(boxes):
        assert right + 2 <= left, f"{text} runs into {following}: {boxes}"
    assert boxes[0][0] >= chart["x"]
    assert boxes[-1][1] <= chart["x"] + chart["width"]
    assert not browser.problems, browser.problems


def test_webhook_deliveries_show_their_status_at_1280_px(
    logged_in: tuple[AsgiServer, BrowserPage],
) -> None:
    server, browser = logged_in
    page = browser.page
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"{server.url}/admin/webhooks/webhookdelivery/")
    shot = screenshot(page, "deliveries-1280")
    assert page.locator("#result_list tbody tr").count() == 3
    assert _right_edge(page, "#result_list th.column-status") <= 1280, shot
    assert _overflow(page, "#changelist .results") <= 0, shot
    # The whole URL is a hover away.
    assert page.locator(f'#result_list span[title="{LONG_URL}"]').count() == 3
    assert not browser.problems, browser.problems


def test_the_api_docs_page_names_every_webhook_event(
    asgi_server: Callable[..., AsgiServer], open_browser: Callable[[], BrowserPage]
) -> None:
    server = asgi_server()
    page = open_browser().page
    page.goto(f"{server.url}/v1/docs/")
    description = page.locator(".swagger-ui .info .description")
    description.wait_for()
    text = description.inner_text()
    for event in EVENT_TYPES:
        assert event in text, event
