"""Scenario 6: web-1, then web-2, restarted (SIGTERM, then started again) while
tenants submit, poll and stream through the load balancer: no request fails at
the client. A web process that gets SIGTERM stops accepting, finishes what it is
answering and exits; HAProxy sends new connections to the other one (a refused
connection is retried there)."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest

from tests.cluster.hosts import wait_until
from tests.cluster.stack import Cluster
from tests.cluster.workload import stream_one

pytestmark = pytest.mark.cluster


def test_a_rolling_restart_of_the_web_hosts_fails_no_request(cluster: Cluster) -> None:
    stop = threading.Event()
    answers: list[int] = []
    failures: list[str] = []

    def tenant() -> None:
        with cluster.api(timeout=30) as api:
            while not stop.is_set():
                try:
                    made = api.post("/v1/speech", json={"text": "Rolling, not falling."})
                    answers.append(made.status_code)
                    if made.status_code == 202:
                        answers.append(api.get(f"/v1/speech/{made.json()['id']}").status_code)
                    answers.append(api.get("/v1/usage").status_code)
                except httpx.HTTPError as exc:
                    failures.append(repr(exc))

    def streamer() -> None:
        while not stop.is_set():
            outcome = stream_one(cluster, "A stream across a restart.")
            answers.append(outcome.status)
            if outcome.error:
                failures.append(f"stream {outcome.job_id}: {outcome.status} {outcome.error}")

    threads = [threading.Thread(target=tenant) for _ in range(3)]
    threads.append(threading.Thread(target=streamer))
    for thread in threads:
        thread.start()
    try:
        time.sleep(2)
        for name in ("web-1", "web-2"):
            service = cluster.host(name).services["web"]
            service.signal(signal.SIGTERM)
            # It finishes what it answers, then ends as SIGTERM asked.
            assert service.process.wait(timeout=60) in (0, -signal.SIGTERM), service.tail()
            cluster.start_web(name)
            # Back in the balancer's rotation before the next one goes.
            wait_until(
                lambda name=name: _in_rotation(cluster, name),  # type: ignore[misc]
                timeout=30,
                what=f"{name} back in HAProxy",
            )
        time.sleep(2)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert failures == []
    bad = [status for status in answers if status not in (200, 202)]
    assert bad == [], f"{len(bad)} of {len(answers)} answers failed: {sorted(set(bad))}"
    assert len(answers) > 50
    print(f"rolling restart: {len(answers)} answers, 0 failed")


def _in_rotation(cluster: Cluster, name: str) -> bool:
    log = cluster.host("lb").services["haproxy"].tail(400)
    ups = [line for line in log.splitlines() if f"web/{name} is UP" in line]
    downs = [line for line in log.splitlines() if f"web/{name} is DOWN" in line]
    return len(ups) >= len(downs) and bool(ups or not downs)
