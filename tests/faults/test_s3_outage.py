"""Fault: the object store goes away while jobs run, and comes back.

Storage is the S3 backend on moto's server, run here on a port of its own so it
can be stopped (connections refused: every `put_object` of a finishing job fails)
and started again on the same port seconds later (moto keeps its buckets in this
process, so they are still there).

A finished job's audio is in hand: its write is tried again, with backoff and
jitter, for `CHORUS_STORAGE_RETRY_WINDOW` (60 s by default), and an outage shorter
than that costs the job nothing but the wait. Past the window the job goes back to
its queue after a backoff (`job_retry_later`); its output key is deterministic, so
a retry overwrites rather than duplicates.

Expected: none charged twice, none unfinished past the bound; within the window
every job succeeds at its first attempt; past it each job either succeeds once the
store is back or, if all its attempts met the outage, fails with
`storage_unavailable` and is refunded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from django.utils import timezone
from moto.server import ThreadedMotoServer

from synthesis.models import FINISHED, Job, JobStatus
from synthesis.services.jobs import job_create
from synthesis.speech_request import SpeechRequest
from tenants.models import Plan
from tests.conftest import make_persona
from tests.e2e.asgi import free_port
from tests.e2e.conftest import SYNTHETIC, WorkerProcess
from tests.faults.figures import outcome, wait_until_finished

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

JOBS = 8
OUTAGE_S = 4.0
BOUND_S = 30.0  # no job may stay unfinished longer than this after the store is back
TEXT = "The store went away, and the audio waited for it."  # ~1.2 s at rtf 0.5
KEYS = {"S3_ACCESS_KEY_ID": "chorus-test", "S3_SECRET_ACCESS_KEY": "chorus-test-secret"}


class StoppableS3:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: ThreadedMotoServer | None = None
        self.start()

    def start(self) -> None:
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


@pytest.fixture
def s3_store(settings: Any) -> Iterator[StoppableS3]:
    store = StoppableS3()
    settings.STORAGE = {
        **settings.STORAGE,
        "backend": "s3",
        "endpoint_url": store.url,
        "access_key": KEYS["S3_ACCESS_KEY_ID"],
        "secret_key": KEYS["S3_SECRET_ACCESS_KEY"],
        "region": "us-east-1",
        "bucket_prefix": "chorus-faults-",
    }
    yield store
    store.stop()


def test_jobs_that_meet_an_s3_outage_past_the_retry_window_succeed_after_it_or_fail_refunded(
    s3_store: StoppableS3,
    start_worker: Callable[..., WorkerProcess],
    plan: Plan,
    tmp_path: Any,
) -> None:
    worker = start_worker(
        {
            "CHORUS_STORAGE": "s3",
            "S3_ENDPOINT_URL": s3_store.url,
            "S3_REGION": "us-east-1",
            "CHORUS_BUCKET_PREFIX": "chorus-faults-",
            "CHORUS_WORKER_STREAMS": "4",
            "CHORUS_ENGINE_OPTIONS": json.dumps(
                {**SYNTHETIC, "rtf": 0.5, "state_dir": str(tmp_path / "gpu")}
            ),
            "CHORUS_STORAGE_RETRY_WINDOW": "1",  # the outage outlasts it
            **KEYS,
        }
    )
    alice = make_persona("alice", plan)  # its bucket is made on the S3 server
    ids = [
        job_create(tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text=TEXT)).pk
        for _ in range(JOBS)
    ]
    deadline = time.monotonic() + 20
    while not Job.objects.filter(pk__in=ids, status=JobStatus.RUNNING).exists():
        assert time.monotonic() < deadline, "".join(worker.lines[-40:])
        time.sleep(0.05)

    s3_store.stop()
    time.sleep(OUTAGE_S)
    s3_store.start()
    repaired_at = timezone.now()
    wait_until_finished(ids, bound_s=BOUND_S)

    result = outcome(tenant=alice.tenant, job_ids=ids, repaired_at=repaired_at)
    seen = [alice.client.get(f"/v1/speech/{job_id}").json() for job_id in ids]
    retried = Job.objects.filter(pk__in=ids, attempts__gt=1).count()
    succeeded = [job for job in seen if job["status"] == "succeeded"]
    failed = [job for job in seen if job["status"] == "failed"]
    client_saw = (
        f"{len(succeeded)} succeeded with a working audio_url, "
        f"{len(failed)} failed storage_unavailable (refunded); {retried} retried after backoff"
    )
    print("\n" + result.line(f"s3 down {OUTAGE_S:.0f} s mid-job", client_saw))
    assert result.lost == 0, (result.statuses, "".join(worker.lines[-40:]))
    assert result.double_charged == 0
    assert result.longest_stall_s < BOUND_S
    assert len(succeeded) + len(failed) == JOBS
    for job in failed:
        assert job["error"]["code"] == "storage_unavailable", job
    for job in succeeded:
        download = httpx.get(job["audio_url"], timeout=10)
        assert download.status_code == 200
        assert len(download.content) == Job.objects.get(pk=job["id"]).output_bytes
    assert retried >= 1, "no job met the outage"
    assert "storage unavailable, retrying" in "".join(worker.lines)


LONG_OUTAGE_S = 25.0
LONG_OUTAGE_JOBS = 6
# About 4 s of audio, 2 s to synthesize at rtf 0.5: all six are mid-synthesis
# when the store goes away, and all meet it at their write.
LONG_OUTAGE_TEXT = "The store was away for twenty-five seconds, and the audio waited."


def test_jobs_that_meet_an_s3_outage_within_the_retry_window_keep_their_audio_and_succeed(
    s3_store: StoppableS3,
    start_worker: Callable[..., WorkerProcess],
    plan: Plan,
    tmp_path: Any,
) -> None:
    worker = start_worker(
        {
            "CHORUS_STORAGE": "s3",
            "S3_ENDPOINT_URL": s3_store.url,
            "S3_REGION": "us-east-1",
            "CHORUS_BUCKET_PREFIX": "chorus-faults-",
            "CHORUS_WORKER_STREAMS": str(LONG_OUTAGE_JOBS),
            "CHORUS_ENGINE_OPTIONS": json.dumps(
                {**SYNTHETIC, "rtf": 0.5, "state_dir": str(tmp_path / "gpu")}
            ),
            **KEYS,  # the retry window is the default's
        }
    )
    alice = make_persona("alice", plan)
    ids = [
        job_create(
            tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text=LONG_OUTAGE_TEXT)
        ).pk
        for _ in range(LONG_OUTAGE_JOBS)
    ]
    deadline = time.monotonic() + 20
    while Job.objects.filter(pk__in=ids, status=JobStatus.RUNNING).count() < len(ids):
        assert time.monotonic() < deadline, "".join(worker.lines[-40:])
        time.sleep(0.05)

    s3_store.stop()
    time.sleep(LONG_OUTAGE_S)
    # Every job had its audio before the store came back, and none gave up on it.
    unfinished = Job.objects.filter(pk__in=ids).exclude(status__in=FINISHED).count()
    s3_store.start()
    repaired_at = timezone.now()
    wait_until_finished(ids, bound_s=BOUND_S)

    result = outcome(tenant=alice.tenant, job_ids=ids, repaired_at=repaired_at)
    seen = [alice.client.get(f"/v1/speech/{job_id}").json() for job_id in ids]
    synthesized_again = Job.objects.filter(pk__in=ids, attempts__gt=1).count()
    succeeded = [job for job in seen if job["status"] == "succeeded"]
    client_saw = (
        f"{len(succeeded)} of {len(ids)} succeeded with a working audio_url; "
        f"{synthesized_again} synthesized again"
    )
    print("\n" + result.line(f"s3 down {LONG_OUTAGE_S:.0f} s as jobs store", client_saw))
    lines = "".join(worker.lines)
    assert unfinished == len(ids), "".join(worker.lines[-40:])
    assert result.lost == 0, (result.statuses, "".join(worker.lines[-40:]))
    assert result.double_charged == 0
    assert result.longest_stall_s < BOUND_S
    assert len(succeeded) == len(ids), seen
    assert synthesized_again == 0
    for job in succeeded:
        download = httpx.get(job["audio_url"], timeout=10)
        assert download.status_code == 200
        assert len(download.content) == Job.objects.get(pk=job["id"]).output_bytes
    assert lines.count("failed; trying again") >= len(ids)  # each met the outage
    assert "storage unavailable, retrying" not in lines  # none went back to its queue
