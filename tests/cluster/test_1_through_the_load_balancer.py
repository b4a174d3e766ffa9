"""Scenario 1: everything a tenant does, through HAProxy to two web hosts, with
the work on two GPU hosts and a light host, and every host's metrics adding up.

All of it goes through PgBouncer in transaction mode and reaches Redis through
Sentinel (scenario 9 is every scenario here)."""

from __future__ import annotations

import json
import time

import pytest

from tests.cluster.stack import METRICS_PORT, WEB_PORT, Cluster
from tests.cluster.workload import (
    metric_sum,
    stream_many,
    submit,
    wait_finished,
    wrongly_charged,
)

pytestmark = pytest.mark.cluster

LONG_TEXT = " ".join(
    f"Sentence number {n} of a long text travels as a segment of its own." for n in range(12)
)


def test_streams_long_texts_batches_and_webhooks_all_succeed_across_hosts(
    cluster: Cluster,
) -> None:
    with cluster.api() as api:
        endpoint = api.post(
            "/v1/webhooks/endpoints",
            json={"url": f"http://{cluster.host('hooks').address}:8080/chorus"},
        )
        assert endpoint.status_code == 201, endpoint.text

        streams = stream_many(cluster, 12, parallel=6)
        assert [s.status for s in streams] == [200] * 12, [s.error for s in streams if s.error]
        assert min(s.audio_bytes for s in streams) > 10_000

        longform = submit(api, LONG_TEXT)
        batch = api.post(
            "/v1/batches",
            json={
                "items": [{"custom_id": f"line-{n}", "text": f"Batch line {n}."} for n in range(6)]
            },
        )
        assert batch.status_code == 202, batch.text
        batch_id = batch.json()["id"]

        jobs = wait_finished(api, [longform, *(s.job_id for s in streams)], timeout=180)
        assert {job["status"] for job in jobs.values()} == {"succeeded"}
        assert jobs[longform]["progress"]["segments_done"] >= 2

        deadline = time.monotonic() + 120
        while True:
            manifest = api.get(f"/v1/batches/{batch_id}").json()
            if manifest["archive"]["status"] == "ready":
                break
            assert time.monotonic() < deadline, manifest
            time.sleep(1)
        assert manifest["status"] == "completed"
        archive = api.get(
            manifest["archive"]["url"].replace(f"http://{cluster.host('lb').address}", "")
        )
        assert archive.status_code == 200
        assert archive.content[:2] == b"PK"

    # Each finished single job and the long text reached the customer's receiver.
    received = _received(cluster, {s.job_id for s in streams} | {longform})
    assert all("webhook-signature" in r["headers"] for r in received)

    # The work was spread over both GPU hosts ...
    worked_on = {
        row[0].partition(":")[0]
        for row in cluster.query("SELECT DISTINCT worker FROM synthesis_job WHERE worker <> ''")
    }
    assert worked_on == {"gpu-1", "gpu-2"}
    # ... and every host's metrics, scraped where the work ran, add up to it.
    done_in_db = cluster.query("SELECT count(*) FROM synthesis_job WHERE status = 'succeeded'")[0][
        0
    ]
    # (A long text's segments end on GPU hosts, the text itself where it is joined.)
    finished_per_host = {
        host: metric_sum(
            cluster.scrape(host, METRICS_PORT), "chorus_jobs_finished_total", status="succeeded"
        )
        for host in ("gpu-1", "gpu-2", "light")
    }
    assert sum(finished_per_host.values()) == done_in_db, finished_per_host
    assert finished_per_host["light"] == 1
    submits_seen = sum(
        metric_sum(
            cluster.scrape(web, WEB_PORT),
            "chorus_http_requests_total",
            route="speech-list",
            method="POST",
        )
        for web in ("web-1", "web-2")
    )
    assert submits_seen == len(streams) + 1
    assert metric_sum(cluster.scrape("sweeper-1", METRICS_PORT), "chorus_sweeps_total") > 0
    assert wrongly_charged(cluster) == []


def _received(cluster: Cluster, job_ids: set[str]) -> list[dict]:  # type: ignore[type-arg]
    """Every delivery, once a `speech.succeeded` came for each of `job_ids`
    (deliveries are at least once: a retried one may come twice)."""
    path = cluster.host("hooks").data_dir / "received.jsonl"
    deadline = time.monotonic() + 60
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        records = [json.loads(line) for line in lines]
        succeeded = {
            r["body"]["data"]["id"] for r in records if r["body"]["type"] == "speech.succeeded"
        }
        if job_ids <= succeeded:
            return records
        assert time.monotonic() < deadline, f"no webhook for {sorted(job_ids - succeeded)}"
        time.sleep(0.5)
