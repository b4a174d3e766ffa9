"""Scenario 8: one GPU host's clock runs 3 s ahead (faketime on its processes).
The timings the API reports are never negative, and neither they nor that
host's queue-wait histogram are off by 3 s: durations that span hosts are taken
on the database's clock."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.cluster.stack import METRICS_PORT, Cluster
from tests.cluster.workload import FINISHED, metric_sum, submit

pytestmark = pytest.mark.cluster

OFFSET_S = 3.0
# What polling adds to the span a client sees: its 0.2 s sleep and a request.
POLL_SLACK_S = 0.5


def test_a_gpu_host_whose_clock_is_ahead_reports_true_timings(cluster: Cluster) -> None:
    gpu = cluster.host("gpu-1")
    gpu.services["worker"].stop()
    gpu.clock_offset_s = OFFSET_S
    try:
        cluster.start_gpu_worker("gpu-1")
        before = _waits_observed(cluster)
        with cluster.api() as api:
            submitted: dict[str, float] = {}
            for n in range(12):
                started = time.monotonic()
                submitted[submit(api, f"Skewed clocks, job {n}.")] = started
            jobs, seen = _poll_until_finished(api, submitted)
        on_skewed = _ran_on(cluster, "gpu-1", list(jobs))
        assert on_skewed, "no job ran on the host whose clock is ahead"
        for job_id, job in jobs.items():
            assert job["status"] == "succeeded", job
            timings = job["timings"]
            # A span is never longer than the client saw it last (from before its
            # submit to the poll that found it done): a stamp taken on a clock 3 s
            # ahead would make it 3 s longer than that.
            lived = seen[job_id] - submitted[job_id] + POLL_SLACK_S
            assert 0 <= timings["queue_wait_s"] <= timings["total_s"] < lived, (timings, lived)
        # The host's histogram took the same waits the API reports, not 3 s more each.
        after = _waits_observed(cluster)
        observed = after[0] - before[0]
        count = after[1] - before[1]
        reported = sum(jobs[job_id]["timings"]["queue_wait_s"] for job_id in on_skewed)
        assert count == len(on_skewed)
        assert abs(observed - reported) < 0.1 * count + 0.5, (observed, reported, count)
    finally:
        gpu.services["worker"].stop()
        gpu.clock_offset_s = 0.0
        cluster.start_gpu_worker("gpu-1")


def _poll_until_finished(
    api: httpx.Client, submitted: dict[str, float], timeout: float = 120
) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    """Each job's final state and when (client's monotonic clock) it was seen."""
    jobs: dict[str, dict[str, Any]] = {}
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(jobs) < len(submitted):
        for job_id in submitted.keys() - jobs.keys():
            answer = api.get(f"/v1/speech/{job_id}")
            if answer.status_code == 200 and answer.json()["status"] in FINISHED:
                seen[job_id] = time.monotonic()
                jobs[job_id] = answer.json()
        assert time.monotonic() < deadline, f"{len(submitted) - len(jobs)} jobs unfinished"
        time.sleep(0.2)
    return jobs, seen


def _ran_on(cluster: Cluster, host: str, ids: list[str]) -> set[str]:
    rows = cluster.query(
        "SELECT id::text FROM synthesis_job WHERE id = ANY(%s::uuid[]) AND worker LIKE %s",
        (ids, f"{host}:%"),
    )
    return {row[0] for row in rows}


def _waits_observed(cluster: Cluster) -> tuple[float, float]:
    scrape = cluster.scrape("gpu-1", METRICS_PORT)
    return (
        metric_sum(scrape, "chorus_job_queue_wait_seconds_sum"),
        metric_sum(scrape, "chorus_job_queue_wait_seconds_count"),
    )
