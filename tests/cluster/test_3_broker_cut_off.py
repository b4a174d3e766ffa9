"""Scenario 3: the broker's hosts (master, replica and Sentinels) cut off the
network for 10 s. Streamed submits meanwhile answer 503 with Retry-After and
leave nothing behind (no job row, no charge); every job queued before the cut
finishes after it."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.cluster.hosts import wait_until
from tests.cluster.stack import WEB_PORT, Cluster, address
from tests.cluster.workload import stream_one, submit, wait_finished, wrongly_charged

pytestmark = pytest.mark.cluster

BROKER_HOSTS = ("broker-1", "broker-2", "broker-3")
CUT_S = 10.0


def test_a_broker_cut_off_refuses_streams_cleanly_and_loses_nothing(cluster: Cluster) -> None:
    with cluster.api(timeout=30) as api:
        before = [submit(api, f"Queued before the cut, number {n}.") for n in range(8)]
        jobs_before = cluster.query("SELECT count(*) FROM synthesis_job")[0][0]
        for host in BROKER_HOSTS:
            cluster.network.cut(host)  # type: ignore[union-attr]
        cut_at = time.monotonic()
        try:
            time.sleep(1.0)  # connections already open notice only when they are used
            with ThreadPoolExecutor(4) as pool:
                refused = list(pool.map(lambda _: _stream_answer(cluster), range(8)))
        finally:
            time.sleep(max(0.0, CUT_S - (time.monotonic() - cut_at)))
            for host in BROKER_HOSTS:
                cluster.network.plug(host)  # type: ignore[union-attr]

        assert {status for status, _, _ in refused} == {503}, refused
        assert all(retry_after.isdigit() for _, retry_after, _ in refused), refused
        assert {code for _, _, code in refused} == {"queue_unavailable"}
        # Nothing half written: the refused submits made no job.
        assert cluster.query("SELECT count(*) FROM synthesis_job")[0][0] == jobs_before

        jobs = wait_finished(api, before, timeout=120)
    assert {job["status"] for job in jobs.values()} == {"succeeded"}
    assert wrongly_charged(cluster) == []
    # And the cluster serves streams again once every process has reconnected.
    wait_until(lambda: stream_one(cluster).status == 200, timeout=30, what="a stream again")
    wait_until(cluster.broker_settled, timeout=60, what="the broker's master and replica")
    for web in ("web-1", "web-2"):  # both, before the next scenario
        wait_until(
            lambda web=web: (
                httpx.get(f"http://{address(web)}:{WEB_PORT}/readyz").status_code == 200
            ),
            timeout=30,
            what=f"{web} ready",
        )


def _stream_answer(cluster: Cluster) -> tuple[int, str, str]:
    with cluster.api(timeout=30) as api:
        answer = api.post("/v1/speech", json={"text": "During the cut.", "stream": True})
        code = answer.json()["error"]["code"] if answer.status_code >= 400 else ""
        return answer.status_code, answer.headers.get("Retry-After", ""), code
