"""Scenario 4 (last: it leaves the broker on the promoted replica): the Redis
master's host dies (its Redis and Sentinel SIGKILLed, its link down) while jobs
run. Sentinel promotes the replica; web processes and workers follow it through
their `sentinel://` URL, with no restart; no job is lost."""

from __future__ import annotations

import time

import pytest

from tests.cluster.hosts import wait_until
from tests.cluster.stack import Cluster
from tests.cluster.workload import stream_one, submit, wait_finished, wrongly_charged

pytestmark = pytest.mark.cluster


def test_the_replica_takes_over_from_a_dead_master_and_no_job_is_lost(cluster: Cluster) -> None:
    with cluster.api(timeout=30) as api:
        before = [submit(api, f"Before the failover, job {n}.") for n in range(10)]
        master = cluster.redis_master()
        replica = "broker-2" if master == "broker-1" else "broker-1"
        cluster.network.kill_processes(master)  # type: ignore[union-attr]
        cluster.network.cut(master)  # type: ignore[union-attr]
        killed = time.monotonic()
        wait_until(
            lambda: cluster.redis_master() == replica,
            timeout=60,
            what=f"Sentinel promoting {replica}",
        )
        promoted_after = time.monotonic() - killed
        after: list[str] = []
        deadline = time.monotonic() + 60
        while len(after) < 10:  # submits answer 503 until web processes reconnect
            answer = api.post("/v1/speech", json={"text": f"After the failover, {len(after)}."})
            if answer.status_code == 202:
                after.append(answer.json()["id"])
            else:
                assert answer.status_code == 503, answer.text
                assert time.monotonic() < deadline, answer.text
                time.sleep(0.5)
        jobs = wait_finished(api, before + after, timeout=180)
    assert {job["status"] for job in jobs.values()} == {"succeeded"}
    wait_until(lambda: stream_one(cluster).status == 200, timeout=30, what="a stream again")
    assert wrongly_charged(cluster) == []
    print(
        f"Redis master {master} lost: {replica} promoted after {promoted_after:.1f} s, 0 jobs lost"
    )
