"""Scenario 8: one GPU host's clock runs 3 s ahead (faketime on its processes).
The timings the API reports are never negative, and neither they nor that
host's queue-wait histogram are off by 3 s: durations that span hosts are taken
on the database's clock."""

from __future__ import annotations

import pytest

from tests.cluster.stack import METRICS_PORT, Cluster
from tests.cluster.workload import metric_sum, submit, wait_finished

pytestmark = pytest.mark.cluster

OFFSET_S = 3.0


def test_a_gpu_host_whose_clock_is_ahead_reports_true_timings(cluster: Cluster) -> None:
    gpu = cluster.host("gpu-1")
    gpu.services["worker"].stop()
    gpu.clock_offset_s = OFFSET_S
    try:
        cluster.start_gpu_worker("gpu-1")
        before = _waits_observed(cluster)
        with cluster.api() as api:
            ids = [submit(api, f"Skewed clocks, job {n}.") for n in range(16)]
            jobs = wait_finished(api, ids)
        on_skewed = [job for job in jobs.values() if job["id"] in _ran_on(cluster, "gpu-1", ids)]
        assert on_skewed, "no job ran on the host whose clock is ahead"
        for job in jobs.values():
            timings = job["timings"]
            spans = [timings["queue_wait_s"], timings["total_s"], timings["first_audio_s"]]
            if spans[-1] is None:  # a job nobody streamed may not stamp its first audio
                spans.pop()
            assert all(span is not None and 0 <= span < OFFSET_S for span in spans), timings
        # The host's histogram took the same waits the API reports, not 3 s more each.
        after = _waits_observed(cluster)
        observed = after[0] - before[0]
        count = after[1] - before[1]
        reported = sum(job["timings"]["queue_wait_s"] for job in on_skewed)
        assert count == len(on_skewed)
        assert abs(observed - reported) < 0.1 * count + 0.5, (observed, reported, count)
    finally:
        gpu.services["worker"].stop()
        gpu.clock_offset_s = 0.0
        cluster.start_gpu_worker("gpu-1")


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
