"""How long `POST /v1/batches/{id}/cancel` takes, on PostgreSQL and on SQLite.

For each backend (its own process: a database of the bench's own), one batch of
`--items` items (the enterprise plan's most, 5,000) is submitted through
`batch_create`, its items left waiting as admission leaves them (a few queued,
the rest pending), and cancelled through the API (Django's test client, in this
process: the view, the service and the manifest's first page, no network). Then
the end a light worker runs (`batch_cancel_finish`) is timed, and the ledger
checked: every item one reservation and one refund, nothing reserved left.

`--pair` adds the scenario that held a web process's threads: two batches of
half the size, cancelled at once from two threads, while a third thread reads
another tenant's `GET /v1/usage` every 50 ms; the slowest of those reads is
reported with the two cancels.

    .venv/bin/python bench/batch_cancel.py [--items 5000] [--pair] [--backends postgres,sqlite]

DATABASE_URL (PostgreSQL; its database is made if missing) and REDIS_URL as for
the other benchmarks; SQLite runs in a fresh temporary file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/chorus_bench_cancel")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/13")
os.environ.setdefault("CHORUS_LOG_LEVEL", "WARNING")


def _setup(backend: str) -> None:
    import harness

    if backend == "sqlite":
        folder = tempfile.mkdtemp(prefix="chorus-bench-cancel-")
        os.environ["DATABASE_URL"] = f"sqlite:///{folder}/chorus.sqlite3"
        os.environ["CHORUS_DATA_DIR"] = folder
        harness.ensure_database = lambda: None  # type: ignore[assignment]
    harness.setup(broker_slots=2)


def _client(slug: str) -> tuple[Any, Any]:
    import harness
    from rest_framework.test import APIClient

    from tenants.services import api_key_create

    tenant = harness.tenant(slug)
    _, key = api_key_create(tenant=tenant, name="bench")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return tenant, client


def _batch(tenant: Any, items: int) -> Any:
    from batches.services import ItemSpec, batch_create
    from synthesis.speech_request import SpeechRequest

    specs = [
        ItemSpec(speech=SpeechRequest(text=f"Item {n} of the cancel benchmark.", reuse=False))
        for n in range(items)
    ]
    return batch_create(tenant=tenant, api_key=None, items=specs)


def _cancel(client: Any, batch: Any) -> tuple[float, int]:
    started = time.perf_counter()
    response = client.post(f"/v1/batches/{batch.pk}/cancel")
    return time.perf_counter() - started, response.status_code


def _ledger_exact(batch: Any) -> bool:
    from django.db.models import Count, Q

    from quotas.models import LedgerEntry, UsagePeriod
    from synthesis.models import Job, JobStatus

    jobs = Job.objects.filter(batch_item__batch=batch)
    if jobs.exclude(status=JobStatus.CANCELLED).exists():
        return False
    per_job = (
        LedgerEntry.objects.filter(job__in=jobs)
        .values("job_id")
        .annotate(
            reserve=Count("id", filter=Q(kind="reserve")),
            refund=Count("id", filter=Q(kind="refund")),
            commit=Count("id", filter=Q(kind="commit")),
        )
    )
    rows = list(per_job)
    period = UsagePeriod.objects.get(tenant_id=batch.tenant_id)
    return (
        len(rows) == jobs.count()
        and all((r["reserve"], r["refund"], r["commit"]) == (1, 1, 0) for r in rows)
        and period.characters_reserved == 0
    )


def run_one(backend: str, items: int, pair: bool) -> dict[str, Any]:
    _setup(backend)
    from batches.cancelling import batch_cancel_finish

    result: dict[str, Any] = {"backend": backend, "items": items}
    tenant, client = _client(f"cancel-{backend}")
    client.get("/v1/batches")  # the first request of a process loads what every one uses
    started = time.perf_counter()
    batch = _batch(tenant, items)
    result["admit_s"] = time.perf_counter() - started
    result["cancel_s"], result["status"] = _cancel(client, batch)
    started = time.perf_counter()
    batch_cancel_finish(batch_id=batch.pk)
    result["finish_s"] = time.perf_counter() - started
    result["exact"] = _ledger_exact(batch)
    if pair:
        result.update(_pair(backend, items // 2))
    return result


def _pair(backend: str, items: int) -> dict[str, Any]:
    """Two cancels at once, and another tenant's usage read meanwhile."""
    from django.db import connection

    a_tenant, a_client = _client(f"pair-a-{backend}")
    b_tenant, b_client = _client(f"pair-b-{backend}")
    _, reader = _client(f"reader-{backend}")
    batches = [(a_client, _batch(a_tenant, items)), (b_client, _batch(b_tenant, items))]
    cancels: list[float] = []
    reads: list[float] = []
    done = threading.Event()

    def cancel(client: Any, batch: Any) -> None:
        try:
            cancels.append(_cancel(client, batch)[0])
        finally:
            connection.close()

    def read() -> None:
        try:
            while not done.is_set():
                started = time.perf_counter()
                reader.get("/v1/usage")
                reads.append(time.perf_counter() - started)
                time.sleep(0.05)
        finally:
            connection.close()

    reading = threading.Thread(target=read)
    reading.start()
    time.sleep(0.2)
    threads = [threading.Thread(target=cancel, args=pair) for pair in batches]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(0.2)
    done.set()
    reading.join()
    from batches.cancelling import batch_cancel_finish

    for _, batch in batches:  # what the light worker runs next
        batch_cancel_finish(batch_id=batch.pk)
    return {
        "pair_items": items,
        "pair_cancel_max_s": max(cancels),
        "usage_max_s": max(reads),
        "usage_reads": len(reads),
        "pair_exact": all(_ledger_exact(batch) for _, batch in batches),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=5000)
    parser.add_argument("--pair", action="store_true")
    parser.add_argument("--backends", default="postgres,sqlite")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(args.child, args.items, args.pair)))
        return
    rows = []
    for backend in args.backends.split(","):
        argv = [sys.executable, __file__, "--child", backend, "--items", str(args.items)]
        out = subprocess.run(
            [*argv, *(["--pair"] if args.pair else [])],
            check=True,
            capture_output=True,
            text=True,
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(
        "| backend | items | admission s | cancel answered s | HTTP | end (light task) s "
        "| ledger exact | 2 cancels at once: slowest s | another tenant's /v1/usage: slowest s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        pair = (
            f"{r['pair_cancel_max_s']:.3f} ({r['pair_items']} items each)"
            f"{'' if r['pair_exact'] else ' NOT EXACT'} | {r['usage_max_s']:.3f}"
            if "pair_items" in r
            else "- | -"
        )
        print(
            f"| {r['backend']} | {r['items']} | {r['admit_s']:.1f} | {r['cancel_s']:.3f} | "
            f"{r['status']} | {r['finish_s']:.3f} | {'yes' if r['exact'] else 'NO'} | {pair} |"
        )


if __name__ == "__main__":
    main()
