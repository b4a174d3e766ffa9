"""The admin in a real browser: the operator's overview after real jobs ran through
a real worker, and every admin page rendering without a script error or a 500."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.db.models import Model

from synthesis.models import Job, WorkerHeartbeat
from tenants.models import Plan
from tests.audio_files import audio_file
from tests.browser.conftest import BrowserPage, screenshot
from tests.conftest import make_persona
from tests.e2e.asgi import AsgiServer
from tests.e2e.conftest import ROOT, WorkerProcess, wait_for_job
from tests.test_admin_pages import REGISTERED, object_of, request_by

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PASSWORD = "a browser's passphrase 42"
# Fair admission would hold most of these jobs back as pending (2 per tenant by
# default); this test is about what ran.
STACK = {"CHORUS_TENANT_BROKER_SLOTS": "1000"}


@pytest.fixture
def operator(transactional_db: None) -> Any:
    return get_user_model().objects.create_superuser("operator", "op@example.com", PASSWORD)


def log_in(browser: BrowserPage, server: AsgiServer) -> None:
    """Through the login form, as a person does."""
    page = browser.page
    page.goto(f"{server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{server.url}/admin/")


def cell_texts(browser: BrowserPage, selector: str) -> list[list[str]]:
    rows = browser.page.locator(selector)
    return [
        [cell.strip() for cell in rows.nth(i).locator("th, td").all_inner_texts()]
        for i in range(rows.count())
    ]


def test_the_overview_shows_the_jobs_a_real_worker_ran(
    asgi_server: Callable[..., AsgiServer],
    start_worker: Callable[..., WorkerProcess],
    plan: Plan,
    operator: Any,
    open_browser: Callable[[], BrowserPage],
    tmp_path: Path,
) -> None:
    server = asgi_server(STACK)
    alice = make_persona("alice", plan)
    api = httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {alice.key}"}, timeout=30
    )
    voice = api.post(
        "/v1/voices",
        data={"name": "narrator", "transcript": "A reference.", "language": "en"},
        files={"audio": ("narrator.flac", audio_file(4.0, 24000, format="FLAC"), "audio/flac")},
    ).json()
    # Submitted while no worker runs, its voice deleted before one takes it: it fails.
    doomed = api.post("/v1/speech", json={"text": "Gone voice.", "voice_id": voice["id"]}).json()
    assert api.delete(f"/v1/voices/{voice['id']}").status_code == 204
    start_worker(STACK)
    ids = [
        api.post("/v1/speech", json={"text": f"Sentence {i}.", "priority": "high"}).json()["id"]
        for i in range(3)
    ]
    finished = [wait_for_job(api, job_id) for job_id in [doomed["id"], *ids]]
    assert [job["status"] for job in finished] == ["failed"] + ["succeeded"] * 3
    code = finished[0]["error"]["code"]
    _wait_for_heartbeat(done=3, failed=1)
    assert Job.objects.filter(error_code=code).count() == 1

    browser_page = open_browser()
    log_in(browser_page, server)
    page = browser_page.page

    for section in ("queues", "workers", "last-hour", "usage"):
        assert page.locator(f"#overview-{section}").is_visible(), section
    assert page.inner_text("#overview-succeeded") == "3"
    assert page.inner_text("#overview-failed") == "1"
    queues = {row[0]: row for row in cell_texts(browser_page, "#overview-queues tbody tr")}
    assert set(queues) >= {"high", "normal", "low"}
    assert queues["high"][1:5] == ["0", "0", "0", "0"]  # broker, queued, pending, running
    workers = cell_texts(browser_page, "#overview-workers tbody tr[data-worker]")
    alive = [row for row in workers if row[1] == "alive"]
    assert len(alive) == 1, workers
    assert alive[0][3] == "synthetic"
    assert alive[0][5] == "high,normal,low"  # the queues it takes, in its order
    assert alive[0][8:10] == ["3", "1"]  # done, failed
    assert code in page.inner_text("#overview-workers tr.last-error")  # a row under it
    assert alive[0][10] == "high 3, normal 1"  # served in the last hour, by priority
    latency = {row[0]: row for row in cell_texts(browser_page, "#overview-latency tbody tr")}
    assert latency["high"][1] == "3"
    assert latency["high"][2] != "-"  # a queue-wait p50 was measured
    assert page.locator("#overview-last-hour svg").count() == 2
    assert "jobs / min" in page.inner_html("#overview-last-hour")
    usage = cell_texts(browser_page, "#overview-usage tbody tr")
    used = sum(len(t) for t in ("Sentence 0.", "Sentence 1.", "Sentence 2."))
    assert usage[0][:2] == ["alice", str(used)]
    assert cell_texts(browser_page, "#overview-failures tbody tr") == [[code, "1"]]
    assert not browser_page.problems, browser_page.problems

    # The failure's link leads to that job in the Jobs admin, its code in a column.
    page.click(f"#overview-failures a:text-is('{code}')")
    page.wait_for_selector("#result_list")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1
    assert code in rows.first.inner_text()
    assert doomed["id"][:8] in rows.first.inner_text()
    assert not browser_page.problems, browser_page.problems

    # The README's screenshot command, against the same server and login.
    out = tmp_path / "overview.png"
    script = ROOT / "bench" / "overview_screenshot.py"
    subprocess.run(
        [sys.executable, str(script), server.url, "--user", "operator", "--out", str(out)],
        env={**os.environ, "CHORUS_ADMIN_PASSWORD": PASSWORD},
        check=True,
        timeout=60,
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _wait_for_heartbeat(*, done: int, failed: int, timeout: float = 15) -> None:
    """The worker reports its counts every couple of seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if WorkerHeartbeat.objects.filter(jobs_done=done, jobs_failed=failed).exists():
            return
        time.sleep(0.2)
    raise AssertionError(list(WorkerHeartbeat.objects.values()))


def _admin_pages(operator: Any, objects: dict[type[Model], Model]) -> list[str]:
    from django.urls import reverse

    request = request_by(operator)
    pages = [reverse("admin:index")]
    for model in REGISTERED:
        model_admin = admin.site._registry[model]
        name = f"admin:{model._meta.app_label}_{model._meta.model_name}"
        pages.append(reverse(f"{name}_changelist"))
        if model_admin.has_add_permission(request):
            pages.append(reverse(f"{name}_add"))
        obj = object_of(model, objects)
        pages.append(reverse(f"{name}_change", args=[obj.pk]))
    return pages


def test_every_admin_page_renders_in_a_browser_without_errors(
    asgi_server: Callable[..., AsgiServer],
    operator: Any,
    objects: dict[type[Model], Model],
    open_browser: Callable[[], BrowserPage],
) -> None:
    server = asgi_server(STACK)
    pages = _admin_pages(operator, objects)
    browser_page = open_browser()
    log_in(browser_page, server)
    page = browser_page.page

    broken: list[str] = []
    for path in pages:
        seen = len(browser_page.problems)
        response = page.goto(f"{server.url}{path}")
        page.wait_for_load_state("load")
        status = response.status if response else 0
        problems = browser_page.problems_since(seen)
        has_content = page.locator("#content").count() == 1
        if status != 200 or problems or not has_content:
            shot = screenshot(page, f"admin{path}")
            broken.append(f"{path}: {status} {problems} (screenshot: {shot})")

    assert len(pages) > 2 * len(REGISTERED)
    assert not broken, "\n".join(broken)
