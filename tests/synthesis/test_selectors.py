"""Reads on the request path: what they answer, and that they stay index lookups.

The plan checks run on PostgreSQL with sequential scans switched off: on a small
test table the planner would rightly prefer one, but what matters here is that an
index fits the query, so a table of millions is not scanned.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from chorus import statements
from synthesis import queue_reads
from synthesis.line_counts import line_statement
from synthesis.models import Job, JobStatus
from tests.conftest import Persona

on_postgresql = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="reads PostgreSQL's query plans"
)


def plan_of(sql: str, params: list[Any]) -> str:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


def generic_plan_of(sql: str, params: list[Any], *, seqscan: bool = False) -> str:
    """The plan of `sql` prepared, as PostgreSQL keeps it once it has run five
    times (`chorus.statements`): planned without its parameters' values."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            if not seqscan:
                # A test's table is tiny, and its statistics are whatever earlier
                # tests left: a heap or bitmap scan then costs less than reading
                # an index in order, which is what a million rows make it choose.
                cursor.execute("SET LOCAL enable_seqscan = off")
                cursor.execute("SET LOCAL enable_bitmapscan = off")
            cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            cursor.execute(f"PREPARE plan_probe AS {statements._numbered(sql)}")
            marks = f"({', '.join(['%s'] * len(params))})" if params else ""
            cursor.execute(f"EXPLAIN EXECUTE plan_probe{marks}", params)
            return "\n".join(row[0] for row in cursor.fetchall())
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DEALLOCATE plan_probe")


def service_seconds() -> float | None:
    return queue_reads.read_line(priorities=[], runs=[], alive_since=timezone.now()).service_s


def finished(persona: Persona, *, ago_s: float, took_s: float, status: str = "succeeded") -> Job:
    end = timezone.now() - timedelta(seconds=ago_s)
    return Job.objects.create(
        tenant=persona.tenant,
        text="x",
        characters=1,
        status=status,
        started_at=end - timedelta(seconds=took_s),
        finished_at=end,
    )


def test_the_service_time_is_the_mean_of_the_latest_fifty_successes(alice: Persona) -> None:
    for n in range(50):
        finished(alice, ago_s=n, took_s=2.0)
    for n in range(20):
        finished(alice, ago_s=100 + n, took_s=50.0)  # older: not in the sample
    finished(alice, ago_s=0.5, took_s=99.0, status=JobStatus.FAILED)  # not a success

    assert service_seconds() == pytest.approx(2.0)


def test_without_any_success_there_is_no_service_time(alice: Persona) -> None:
    finished(alice, ago_s=1, took_s=3.0, status=JobStatus.FAILED)

    assert service_seconds() is None


@on_postgresql
def test_the_service_time_reads_the_end_of_an_index(alice: Persona) -> None:
    sql = queue_reads._sql("postgresql")
    plan = generic_plan_of(sql["service"], [])

    assert "job_recent_success" in plan, plan
    assert "Sort" not in plan, plan


@on_postgresql
def test_the_line_is_read_off_the_waiting_index(alice: Persona) -> None:
    """A place in line counts the waiting jobs per tenant and the tenant's older
    pending ones: both off the waiting line's partial index, never history."""
    sql = queue_reads._sql("postgresql")
    now = timezone.now()

    waiting = generic_plan_of(sql["waiting"], [])
    run = [alice.tenant.pk, "normal", now]
    older = generic_plan_of(sql["older"], [*run, *run, uuid.uuid4()])
    queued = generic_plan_of(sql["queued"], ["normal"])

    assert "job_waiting" in waiting, waiting
    # The older ones are counted off the index alone; only jobs created at the
    # very same instant are told apart by id (off whichever index has the instant).
    assert "Index Only Scan using job_waiting" in older, older
    assert "Seq Scan" not in older, older
    assert "job_waiting" in queued or "synthesis_j_status" in queued, queued
    assert "Seq Scan" not in queued, queued


@on_postgresql
def test_a_submits_line_reads_single_jobs_only_and_stops_at_what_decides(
    alice: Persona,
) -> None:
    """Under the tenant's lock at every submit: a batch's items in flight are
    never read (the plan's jobs at once leave them out), and the waiting counts
    stop at one pending job and at the broker slots."""
    statement = line_statement(tenant_id=alice.tenant.pk, priority="normal", slots=2)
    plan = generic_plan_of(statement.sql, list(statement.params))

    assert "job_single_in_flight" in plan, plan
    assert "batchitem" not in plan, plan
    assert plan.count("Limit") == 2, plan
    assert "Seq Scan" not in plan, plan


@on_postgresql
def test_a_batch_waiting_at_another_priority_does_not_make_the_line_a_table_scan(
    alice: Persona,
) -> None:
    """Planned without knowing the priority, a LIMIT over the table looked cheap
    to PostgreSQL once most rows were one tenant's waiting batch (it then read
    all of them to find one pending job of another priority). With real
    statistics and sequential scans allowed, every part stays on an index."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {Job._meta.db_table} (
              id, tenant_id, voice_name, text, characters, priority, format, speed, stream,
              instruction, prompt_source, status, attempts, epoch, error_code, error_message,
              engine, worker, output_key, created_at, language, reuse_key, in_batch)
            SELECT gen_random_uuid(), %s, '', 'item', 4, 'low', 'wav', 1.0, false, '', '',
              'pending', 0, 1, '', '', '', '', '', now(), '', '', true
            FROM generate_series(1, 5000)
            """,
            [alice.tenant.pk],
        )
        cursor.execute(f"ANALYZE {Job._meta.db_table}")
    statement = line_statement(tenant_id=alice.tenant.pk, priority="normal", slots=2)
    plan = generic_plan_of(statement.sql, list(statement.params), seqscan=True)

    assert "Seq Scan" not in plan, plan
