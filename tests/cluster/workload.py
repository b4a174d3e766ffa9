"""What tenants do to the cluster, and how the tests read the outcome."""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster.hosts import wait_until
from tests.cluster.stack import Cluster

FINISHED = {"succeeded", "failed", "cancelled"}
TEXT = "Many machines, one voice: every job finishes once, wherever it runs."


@dataclass
class StreamOutcome:
    status: int
    audio_bytes: int
    job_id: str
    error: str = ""
    seconds: float = 0.0


def stream_one(cluster: Cluster, text: str = TEXT, *, timeout: float = 90) -> StreamOutcome:
    """A streamed submit through the load balancer: the audio in the answer."""
    started = time.monotonic()
    with cluster.api(timeout=timeout) as api:
        try:
            with api.stream("POST", "/v1/speech", json={"text": text, "stream": True}) as answer:
                body = b"".join(answer.iter_bytes())
                job_id = answer.headers.get("X-Job-Id", "") or _job_of(answer)
                error = body.decode(errors="replace")[:300] if answer.status_code >= 400 else ""
                return StreamOutcome(
                    answer.status_code, len(body), job_id, error, time.monotonic() - started
                )
        except httpx.HTTPError as exc:
            return StreamOutcome(0, 0, "", repr(exc), time.monotonic() - started)


def _job_of(answer: httpx.Response) -> str:
    location = answer.headers.get("Location", "")
    return location.rstrip("/").rpartition("/")[2]


def stream_many(
    cluster: Cluster, count: int, *, parallel: int = 8, text: str = TEXT
) -> list[StreamOutcome]:
    with ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(lambda _: stream_one(cluster, text), range(count)))


def submit(api: httpx.Client, text: str = TEXT, **fields: Any) -> str:
    answer = api.post("/v1/speech", json={"text": text, **fields})
    assert answer.status_code == 202, answer.text
    return str(answer.json()["id"])


def wait_finished(
    api: httpx.Client, job_ids: Iterable[str], *, timeout: float = 120
) -> dict[str, dict[str, Any]]:
    """Every job's final state, polled through the load balancer."""
    pending = set(job_ids)
    done: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    while pending:
        for job_id in list(pending):
            answer = api.get(f"/v1/speech/{job_id}")
            if answer.status_code == 200 and answer.json()["status"] in FINISHED:
                done[job_id] = answer.json()
                pending.discard(job_id)
        if pending:
            assert time.monotonic() < deadline, (
                f"{len(pending)} jobs unfinished: {sorted(pending)[:3]}"
            )
            time.sleep(0.5)
    return done


def wait_running(cluster: Cluster, host: str, text: str, *, at_least: int = 2) -> None:
    """Until `at_least` jobs of this text run on `host` (each stream's text is
    the scenario's own: jobs left by earlier scenarios do not count)."""
    wait_until(
        lambda: (
            cluster.query(
                "SELECT count(*) FROM synthesis_job WHERE status = 'running' "
                "AND worker LIKE %s AND text = %s",
                (f"{host}:%", text),
            )[0][0]
            >= at_least
        ),
        timeout=30,
        what=f"streams running on {host}",
    )


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples (with these labels) in one scrape."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def wrongly_charged(cluster: Cluster) -> list[tuple[str, str, list[str]]]:
    """Finished jobs whose settlement is not what their end says: succeeded and
    not committed, or failed/cancelled and committed (the ledger's constraints
    already allow one settlement per job, so "twice" shows up as one of these)."""
    return cluster.query(
        """
        SELECT j.id::text, j.status, array_agg(l.kind ORDER BY l.id)
        FROM synthesis_job j JOIN quotas_ledgerentry l ON l.job_id = j.id
        WHERE j.status IN ('succeeded', 'failed', 'cancelled')
        GROUP BY j.id, j.status
        HAVING (j.status = 'succeeded') <> bool_or(l.kind = 'commit')
        """
    )
