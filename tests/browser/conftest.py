"""A real Chromium (Debian's package) driven by Playwright, against the web tier
under uvicorn. Playwright never downloads a browser here: it starts the system's.

A failed test leaves a screenshot of the page it was on in `var/test-artifacts/
browser/` (CHORUS_TEST_ARTIFACTS overrides), named in the failure report.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

# The web tier, a real worker, and one object of each admin model, shared with
# the end-to-end and admin tests.
from tests.e2e.asgi import asgi_server  # noqa: F401
from tests.e2e.conftest import ROOT, start_worker  # noqa: F401
from tests.test_admin_pages import objects  # noqa: F401

CHROMIUM = os.environ.get("CHORUS_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(os.environ.get("CHORUS_TEST_ARTIFACTS", ROOT / "var" / "test-artifacts"))


@dataclass
class BrowserPage:
    """A page plus what went wrong on it: console errors, uncaught exceptions,
    answers of 500 and above (static files and frames included)."""

    page: Any
    problems: list[str] = field(default_factory=list)

    def problems_since(self, start: int) -> list[str]:
        return self.problems[start:]


def _require_chromium() -> None:
    if Path(CHROMIUM).exists():
        return
    message = f"no Chromium at {CHROMIUM}: apt-get install -y chromium (.ci/run does)"
    if os.environ.get("CHORUS_REQUIRE_BROWSER"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def open_browser(request: pytest.FixtureRequest) -> Iterator[Callable[[], BrowserPage]]:
    """Start Chromium when called. Call it once the test's database work is done:
    Playwright's sync API runs an event loop in this thread, and Django opens a
    separate connection for ORM calls made under it (one nobody closes)."""
    _require_chromium()
    from playwright.sync_api import sync_playwright

    stack = contextlib.ExitStack()

    def open_() -> BrowserPage:
        playwright = stack.enter_context(sync_playwright())
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        stack.callback(browser.close)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        stack.callback(context.close)
        page = context.new_page()
        page.set_default_timeout(15_000)
        wrapped = BrowserPage(page)
        page.on("console", lambda msg: _console(wrapped, msg))
        page.on("pageerror", lambda exc: wrapped.problems.append(f"exception on {page.url}: {exc}"))
        page.on(
            "response",
            lambda r: r.status >= 400 and wrapped.problems.append(f"{r.status} from {r.url}"),
        )
        request.node.browser_page = wrapped
        return wrapped

    with stack:
        yield open_


def _console(wrapped: BrowserPage, msg: Any) -> None:
    # Chromium asks every site for /favicon.ico on its own; the app has none to
    # give, and no page asked for it.
    if msg.type != "error" or msg.location.get("url", "").endswith("/favicon.ico"):
        return
    wrapped.problems.append(f"console error on {wrapped.page.url}: {msg.text} {msg.location}")


def screenshot(page: Any, name: str) -> Path:
    ARTIFACTS.joinpath("browser").mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / "browser" / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)[:150]}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    wrapped = getattr(item, "browser_page", None)
    if report.when == "call" and report.failed and wrapped is not None:
        try:
            path = screenshot(wrapped.page, item.name)
            report.sections.append(("browser", f"screenshot of {wrapped.page.url}: {path}"))
        except Exception as exc:  # the browser itself may be what failed
            report.sections.append(("browser", f"no screenshot: {exc}"))
