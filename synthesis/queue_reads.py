"""What places in line are computed from, read in one round trip.

A poll of a waiting job is the request clients make most, and its answer holds
the job's place in line: each tenant's waiting jobs per priority, the broker's
order of the queued ones, how many of the tenant's pending jobs are older than
the page's, the recent service time, the live workers' streams and the jobs
running now. Built with the ORM these were seven queries whose compilation cost
the web process more CPU than PostgreSQL spent running them (`bench/admission.py
--poll`). Here they are written out once, in SQL that PostgreSQL and SQLite both
run, and sent together (`chorus.statements`, prepared: planned once per
connection) inside the caller's snapshot (`chorus.snapshot`), so they agree with
each other and with the page. On a long line the line's shape is the one
exception (`read_line`).
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection

from chorus.statements import Rows, Statement, execute_together
from synthesis.models import Job, JobStatus, WorkerHeartbeat

# How many of the latest successes the service time is the mean of.
SERVICE_SAMPLE = 50


@dataclass(frozen=True)
class PendingRun:
    """A tenant's pending jobs of one priority on a page: consecutive among its
    pending jobs (a page is a run of its jobs in created_at order), so one count
    of those older than the oldest places them all."""

    tenant_id: int
    priority: str
    oldest: Job


@dataclass(frozen=True)
class LineState:
    waiting: dict[str, dict[int, int]]  # priority -> tenant -> its pending and queued jobs
    queued: dict[str, list[tuple[Any, int]]]  # priority -> (job id as stored, tenant), broker order
    older: dict[PendingRun, int]  # the run's tenant's pending jobs older than the run
    service_s: float | None  # mean run time of the latest successes
    heartbeats: list[tuple[str, int, int, int]]  # live workers: queues, streams per priority
    running: int


@dataclass(frozen=True)
class _Shape:
    """The whole line's shape (each tenant's share, the broker's order), as read
    at `read_at`: kept for a moment when the line is long."""

    read_at: float
    waiting: dict[str, dict[int, int]]
    queued: dict[str, list[tuple[Any, int]]]


# Shared by the process's request threads; replaced whole, never changed.
_kept: _Shape | None = None


def read_line(
    *, priorities: Sequence[str], runs: Sequence[PendingRun], alive_since: datetime
) -> LineState:
    """The line's state for `priorities` and the pending `runs` of a page.

    Each tenant's share of the line is a count over the whole waiting index: on a
    line of `LONG_LINE_JOBS` or more, a shape read less than `LONG_LINE_REUSE_S`
    ago is used again (from an earlier snapshot than the rest; places are
    estimates, and this one moves by more than that meanwhile). The rest (the
    tenant's older pending jobs, the service time, the workers) is read each time."""
    global _kept
    sql = _sql(connection.vendor)
    shape = _kept_shape(priorities)
    statements = []
    if shape is None:
        statements += [
            Statement(sql["waiting"], [], "line_waiting"),
            *(Statement(sql["queued"], [priority], "line_queued") for priority in priorities),
        ]
    statements += [
        *(Statement(sql["older"], _older_params(run), "line_older") for run in runs),
        Statement(sql["service"], [], "line_service"),
        Statement(
            sql["heartbeats"], [_prep(WorkerHeartbeat, "seen_at", alive_since)], "line_heartbeats"
        ),
        Statement(sql["running"], [], "line_running"),
    ]
    results = iter(execute_together(statements))
    if shape is None:
        shape = _shape_from(results, priorities)
        _kept = shape if _total(shape) >= settings.LONG_LINE_JOBS else None
    older = {run: int(_all(next(results))[0][0]) for run in runs}
    [(service,)] = _all(next(results))
    heartbeats = [tuple(row) for row in _all(next(results))]
    running = int(_all(next(results))[0][0])
    return LineState(
        waiting=shape.waiting,
        queued={priority: shape.queued[priority] for priority in priorities},
        older=older,
        service_s=None if service is None else float(service),
        heartbeats=heartbeats,  # type: ignore[arg-type]
        running=running,
    )


def _kept_shape(priorities: Sequence[str]) -> _Shape | None:
    kept = _kept
    if kept is None or time.monotonic() - kept.read_at >= settings.LONG_LINE_REUSE_S:
        return None
    if not all(priority in kept.queued for priority in priorities):
        return None
    return kept


def _shape_from(results: Iterator[Rows | None], priorities: Sequence[str]) -> _Shape:
    read_at = time.monotonic()
    waiting: dict[str, dict[int, int]] = defaultdict(dict)
    for priority, tenant_id, n in _all(next(results)):
        waiting[priority][tenant_id] = int(n)
    queued = {
        priority: [(job_id, tenant_id) for job_id, tenant_id in _all(next(results))]
        for priority in priorities
    }
    return _Shape(read_at=read_at, waiting=dict(waiting), queued=queued)


def _total(shape: _Shape) -> int:
    return sum(n for tenants in shape.waiting.values() for n in tenants.values())


def stored_id(job: Job) -> Any:
    """The job's id as the queued line's rows hold it (a UUID on PostgreSQL,
    its hex on SQLite)."""
    return _prep(Job, "id", job.pk)


def _older_params(run: PendingRun) -> list[Any]:
    """Both ranges of `older`: the run's tenant, priority and oldest job's
    creation, then the same with the oldest job's id."""
    created = _prep(Job, "created_at", run.oldest.created_at)
    the_run = [run.tenant_id, run.priority, created]
    return [*the_run, *the_run, stored_id(run.oldest)]


def _prep(model: type[Any], name: str, value: Any) -> Any:
    return model._meta.get_field(name).get_db_prep_value(value, connection)


def _all(rows: Rows | None) -> Rows:
    assert rows is not None, "a read returns rows"
    return rows


@functools.cache
def _sql(vendor: str) -> dict[str, str]:
    quote = connection.ops.quote_name
    jobs = quote(Job._meta.db_table)
    beats = quote(WorkerHeartbeat._meta.db_table)
    if vendor == "postgresql":
        seconds = "EXTRACT(EPOCH FROM finished_at - started_at)"
    else:  # SQLite keeps timestamps as text; julianday reads them (in days)
        seconds = "(julianday(finished_at) - julianday(started_at)) * 86400.0"
    # Statuses are written in, not passed: a prepared statement's generic plan
    # can use a partial index only where the text itself implies its condition.
    pending, queued, running, succeeded = (
        f"'{status.value}'"
        for status in (JobStatus.PENDING, JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.SUCCEEDED)
    )
    return {
        # One pass over the waiting line's partial index (`job_waiting`) gives
        # what each priority holds and each tenant's share of it.
        "waiting": f"SELECT priority, tenant_id, COUNT(*) FROM {jobs} "
        f"WHERE status IN ({pending}, {queued}) GROUP BY priority, tenant_id",
        # The broker's order is publish order; a job sent but not yet stamped
        # was sent last.
        "queued": f"SELECT id, tenant_id FROM {jobs} WHERE status = {queued} AND priority = %s "
        "ORDER BY published_at ASC NULLS LAST, created_at ASC, id ASC",
        # Two ranges of the same index, so neither reads the rows (an OR of
        # both would be a filter over every pending job of the tenant).
        "older": f"SELECT (SELECT COUNT(*) FROM {jobs} "
        f"WHERE tenant_id = %s AND priority = %s AND status = {pending} AND created_at < %s) + "
        f"(SELECT COUNT(*) FROM {jobs} WHERE tenant_id = %s AND priority = %s "
        f"AND status = {pending} AND created_at = %s AND id < %s)",
        # The end of an index (`job_recent_success`), however many jobs ever ran;
        # a success without a start is left out of the mean.
        "service": f"SELECT AVG({seconds}) FROM (SELECT started_at, finished_at FROM {jobs} "
        f"WHERE status = {succeeded} AND finished_at IS NOT NULL "
        f"ORDER BY finished_at DESC LIMIT {SERVICE_SAMPLE}) recent",
        # A draining worker (SIGTERM) takes no new job: its streams are no capacity.
        "heartbeats": f"SELECT queues, slots, streams_normal, streams_low FROM {beats} "
        "WHERE seen_at >= %s AND draining_since IS NULL",
        "running": f"SELECT COUNT(*) FROM {jobs} WHERE status = {running}",
    }
