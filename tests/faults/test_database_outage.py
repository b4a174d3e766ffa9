"""Fault: the worker loses the database as it takes a job, or while it runs jobs.

A real PostgreSQL role with a connection limit stands for the worker's database
access: the test cuts the worker's connections (`pg_terminate_backend`) and holds
every connection the role may open, so the worker's statements fail as they would
on a database restart or an exhausted pool.

- At the claim: before, the task ended in an error, the broker counted the
  message as delivered, and the job stayed `queued` until the sweeper found it
  (minutes, then). Now the claim is tried again with backoff.
- Mid-job (its first audio's stamp, its checks that it still owns the job, its
  end and charge): before, the write's error failed the job, whose failure could
  not be written either; the job stayed `running` under a live worker until the
  sweeper's task time limit (ten minutes). Now every write waits for the database.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from quotas.models import LedgerKind
from quotas.services import ledger_total
from synthesis.models import Job, JobStatus
from synthesis.services.jobs import job_create
from synthesis.speech_request import SpeechRequest
from tests.conftest import Persona
from tests.e2e.conftest import SYNTHETIC, WorkerProcess
from tests.faults.figures import outcome, wait_until_finished

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

ROLE = "chorus_limited_worker"
ROLE_CONNECTIONS = 8
BOUND_S = 15.0  # the job finishes within this after the database is back


def admin_dsn(database: str) -> str:
    db = connection.settings_dict
    host, port = db["HOST"] or "127.0.0.1", db["PORT"] or 5432
    return f"host={host} port={port} user={db['USER']} dbname={database}"


@pytest.fixture
def limited_role() -> Iterator[str]:
    """A login role limited to ROLE_CONNECTIONS connections; its DATABASE_URL."""
    if connection.vendor != "postgresql":
        pytest.fail("this fault needs PostgreSQL (make test-postgres)")
    database = connection.settings_dict["NAME"]
    with psycopg.connect(admin_dsn(database), autocommit=True) as admin:
        exists = admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [ROLE]).fetchone()
        verb = "ALTER" if exists else "CREATE"
        admin.execute(f"{verb} ROLE {ROLE} LOGIN CONNECTION LIMIT {ROLE_CONNECTIONS}")
        admin.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {ROLE}")
        admin.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {ROLE}")
    db = connection.settings_dict
    yield f"postgres://{ROLE}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{database}"
    with psycopg.connect(admin_dsn(database), autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [ROLE]
        )


def occupy_every_connection(database_url: str) -> list[Any]:
    """Cut the role's connections and hold every one it may open."""
    database = connection.settings_dict["NAME"]
    with psycopg.connect(admin_dsn(database), autocommit=True) as admin:
        held = []
        while len(held) < ROLE_CONNECTIONS:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE usename = %s AND pid <> ALL(%s)",
                [ROLE, [c.info.backend_pid for c in held]],
            )
            try:
                held.append(psycopg.connect(database_url.replace("postgres://", "postgresql://")))
            except psycopg.OperationalError:
                time.sleep(0.05)  # a worker thread took the slot back first
    return held


def test_a_claim_that_meets_no_database_waits_for_it_and_keeps_the_job(
    start_worker: Callable[..., WorkerProcess], alice: Persona, broker: Any, limited_role: str
) -> None:
    worker = start_worker({"DATABASE_URL": limited_role})
    time.sleep(1.0)  # its threads have their connections
    held = occupy_every_connection(limited_role)
    job = job_create(
        tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="Through an outage.")
    )
    outage = 3.0
    time.sleep(outage)
    assert Job.objects.get(pk=job.pk).status == JobStatus.QUEUED  # it could not be claimed
    for held_connection in held:
        held_connection.close()
    released = timezone.now()
    wait_until_finished([job.pk], bound_s=BOUND_S)

    result = outcome(tenant=alice.tenant, job_ids=[job.pk], repaired_at=released)
    job.refresh_from_db()
    seen = alice.client.get(f"/v1/speech/{job.pk}").json()["status"]
    print(
        "\n"
        + result.line(
            f"database outage {outage:.0f} s at the claim", f"queued during the outage, then {seen}"
        )
    )
    assert result.lost == 0, "".join(worker.lines[-40:])
    assert result.double_charged == 0
    assert result.longest_stall_s < BOUND_S
    assert job.status == JobStatus.SUCCEEDED
    assert job.attempts == 1
    assert ledger_total(tenant=alice.tenant, kind=LedgerKind.COMMIT) == job.characters
    assert "database unavailable; trying again" in "".join(worker.lines)


MID_JOB_BOUND_S = 30.0  # every job ends within this after the database is back
MID_JOB_OUTAGE_S = 5.0
LONG = "A long job that is well into its audio when the database goes away. " * 3
SHORT = "A job that has just been claimed when the database goes away."


def wait_for(condition: Any, worker: WorkerProcess, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "".join(worker.lines[-40:])
        time.sleep(0.05)


def test_jobs_running_when_the_database_goes_away_finish_once_it_is_back(
    start_worker: Callable[..., WorkerProcess],
    alice: Persona,
    broker: Any,
    limited_role: str,
    tmp_path: Any,
) -> None:
    # A first chunk 2 s after the claim: a job claimed just before the cut
    # meets the outage at its first audio's stamp.
    engine = {**SYNTHETIC, "first_chunk_delay_s": 2.0, "rtf": 0.5, "state_dir": str(tmp_path)}
    worker = start_worker(
        {
            "DATABASE_URL": limited_role,
            "CHORUS_WORKER_STREAMS": "4",
            "CHORUS_ENGINE_OPTIONS": json.dumps(engine),
        }
    )

    def submit(text: str) -> Any:
        return job_create(
            tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text=text)
        ).pk

    long = submit(LONG)
    wait_for(lambda: Job.objects.filter(pk=long, first_audio_at__isnull=False).exists(), worker)
    claimed = [submit(SHORT) for _ in range(3)]
    wait_for(
        lambda: Job.objects.filter(pk__in=claimed, status=JobStatus.RUNNING).count() == 3, worker
    )
    waiting = [submit(SHORT) for _ in range(4)]  # the worker's four streams are busy
    ids = [long, *claimed, *waiting]

    held = occupy_every_connection(limited_role)
    cut = {job.pk: job for job in Job.objects.filter(pk__in=[long, *claimed])}
    time.sleep(MID_JOB_OUTAGE_S)
    # The outage met them mid-job: none could end while the database was away.
    met = Job.objects.filter(pk__in=[long, *claimed], status=JobStatus.RUNNING).count()
    for held_connection in held:
        held_connection.close()
    released = timezone.now()
    wait_until_finished(ids, bound_s=MID_JOB_BOUND_S)

    result = outcome(tenant=alice.tenant, job_ids=ids, repaired_at=released)
    jobs = {job.pk: job for job in Job.objects.filter(pk__in=ids)}
    seen = {alice.client.get(f"/v1/speech/{job_id}").json()["status"] for job_id in ids}
    # The jobs the outage met (the rest started only after them).
    ran_through = max(
        (jobs[job_id].finished_at - released).total_seconds()
        for job_id in [long, *claimed]
        if jobs[job_id].finished_at is not None
    )
    print(
        "\n"
        + result.line(
            f"database outage {MID_JOB_OUTAGE_S:.0f} s mid-job",
            f"{met} jobs running through the outage, ended {ran_through:.1f} s after it at "
            f"most; all {', '.join(sorted(seen))}",
        )
    )
    assert cut[long].first_audio_at is not None  # mid-synthesis when cut
    assert any(cut[job_id].first_audio_at is None for job_id in claimed)  # just claimed
    assert met == 4
    assert result.lost == 0, (result.statuses, "".join(worker.lines[-40:]))
    assert result.double_charged == 0
    assert result.longest_stall_s < MID_JOB_BOUND_S
    assert {job.status for job in jobs.values()} == {JobStatus.SUCCEEDED}, (
        [(job.status, job.error_code, job.error_message) for job in jobs.values()],
        "".join(worker.lines[-40:]),
    )
    assert {job.attempts for job in jobs.values()} == {1}  # none synthesized twice
    assert all(jobs[job_id].first_audio_at is not None for job_id in claimed)
    assert "database unavailable; trying again" in "".join(worker.lines)
