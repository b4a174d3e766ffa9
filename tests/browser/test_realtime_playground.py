"""The realtime playground in a real Chromium: a key pasted, text sent in pieces
over the WebSocket with a client token, the audio played with WebAudio."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tenants.models import Plan
from tests.browser.conftest import BrowserPage
from tests.conftest import make_persona
from tests.e2e.asgi import AsgiServer
from tests.e2e.conftest import WorkerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_the_playground_speaks_text_sent_in_pieces_and_plays_it(
    asgi_server: Callable[..., AsgiServer],
    start_worker: Callable[..., WorkerProcess],
    plan: Plan,
    open_browser: Callable[[], BrowserPage],
) -> None:
    server = asgi_server()
    alice = make_persona("alice", plan)
    start_worker()
    browser_page = open_browser()
    page: Any = browser_page.page

    page.goto(f"{server.url}/v1/playground/")
    page.fill("#key", alice.key)
    page.fill("#pace", "40")
    page.click("#speak")
    page.wait_for_selector("#status[data-state=closed]", timeout=30_000)

    frames = int(page.get_attribute("#status", "data-frames"))
    scheduled = float(page.get_attribute("#status", "data-played"))
    assert frames > 1
    # (Read through the API: the ORM cannot run under Playwright's event loop.)
    jobs = httpx.get(
        f"{server.url}/v1/speech", headers={"Authorization": f"Bearer {alice.key}"}
    ).json()["results"]
    [job] = jobs
    assert job["status"] == "succeeded"
    assert job["characters"] == len(page.input_value("#text"))
    assert scheduled == pytest.approx(job["duration_s"], abs=0.05)
    # WebAudio's clock ran over the scheduled audio: it was played, not only queued.
    page.wait_for_function(f"audio.currentTime >= {min(scheduled, 2.0)}", timeout=15_000)
    assert "session.closed" in page.text_content("#log")
    assert browser_page.problems == []
