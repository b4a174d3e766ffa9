"""Scraping a process's metrics port (`chorus.metrics_server`) over real HTTP."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def get(port: int, header: str | None = None, path: str = "/metrics") -> httpx.Response:
    headers = {"Authorization": header} if header is not None else {}
    return httpx.get(f"http://127.0.0.1:{port}{path}", headers=headers, timeout=10)


def wait_for_port(
    port: int, *, alive: Callable[[], bool], lines: list[str], timeout: float = 30
) -> None:
    """Until something answers on `port` (any status), while `alive()`; the
    process's output `lines` tell why not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert alive(), f"exited before serving port {port}:\n" + "".join(lines[-40:])
        try:
            get(port)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"nothing answers on port {port}:\n" + "".join(lines[-40:]))


def scrape(port: int, token: str) -> Samples:
    response = get(port, f"Bearer {token}")
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("text/plain; version=")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}
