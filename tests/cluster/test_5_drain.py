"""Scenario 7: a GPU host gets SIGTERM (spot capacity taken back) while it runs
streams. Its worker takes nothing new, its readiness fails at once, its running
streams finish, and it exits; its clients get whole audio."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.cluster.stack import FAST_T4, ROOT, Cluster
from tests.cluster.workload import stream_one, wait_finished, wait_running, wrongly_charged

pytestmark = pytest.mark.cluster

# About 14 s of audio: 3 s of work alone on the emulated T4, more when shared,
# so the streams still run when the readiness probe looks.
TEXT = (
    "Spot capacity gives notice before it is taken back. A draining worker uses "
    "that notice to finish the streams it has begun, and takes no new ones, "
    "while the other GPU hosts carry on with the line. Nothing is lost, nothing "
    "is charged twice, and no client is left waiting for audio that never comes."
)


def test_a_gpu_host_told_to_stop_finishes_its_streams_then_exits(cluster: Cluster) -> None:
    gpu = cluster.host("gpu-2")
    gpu.services["worker"].stop()
    # Slower than real time, so the streams still run when the probe looks.
    worker = cluster.start_gpu_worker("gpu-2", timing={**FAST_T4, "rtf": 1.0})
    with ThreadPoolExecutor(8) as pool:
        streams = [pool.submit(stream_one, cluster, TEXT, timeout=90) for _ in range(8)]
        wait_running(cluster, "gpu-2", TEXT)
        worker.signal(15)
        ready = subprocess.run(
            gpu.command([sys.executable, "manage.py", "worker_ready"]),
            env=cluster.chorus_env("gpu-2"),
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        outcomes = [future.result() for future in streams]
    assert ready.returncode == 1, ready.stdout + ready.stderr
    assert "draining" in ready.stderr
    assert worker.process.wait(timeout=70) == 0, worker.tail()
    assert [o.status for o in outcomes] == [200] * 8, [o.error for o in outcomes]
    with cluster.api() as api:
        jobs = wait_finished(api, [o.job_id for o in outcomes])
    assert {job["status"] for job in jobs.values()} == {"succeeded"}
    assert wrongly_charged(cluster) == []
    cluster.start_gpu_worker("gpu-2")
