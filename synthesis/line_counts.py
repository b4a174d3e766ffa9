"""A tenant's jobs in flight, counted in plain SQL.

These counts run on every submit (under the tenant's lock) and after every claim
(the look for a pending job to release). Built with the ORM (an aggregate with filtered
counts) each cost the web process more CPU than PostgreSQL spent running it, so
they are written out here, once, in SQL that PostgreSQL and SQLite both run.
"""

from __future__ import annotations

from chorus.statements import Rows, Statement, execute_together
from synthesis.models import Job, JobStatus

_JOBS = Job._meta.db_table

# A batch's items (`batches.BatchItem`, reached through the reverse relation so
# this module imports nothing above it).
_BATCH_ITEMS = Job._meta.get_field("batch_item").related_model._meta.db_table  # type: ignore[union-attr, attr-defined]

# Over the (tenant, status, priority) index: the tenant's jobs in flight only.
# The first count is of single jobs (the jobs-at-once limit leaves batch items
# and a long text's segments out: `synthesis.selectors.jobs_in_flight`); the
# waiting counts take every job, as fair admission does.
# The statuses are written into the text (they never change), the tenant and
# priority passed: both are prepared statements (`chorus.statements`).
_PENDING, _QUEUED, _RUNNING = (
    f"'{status.value}'" for status in (JobStatus.PENDING, JobStatus.QUEUED, JobStatus.RUNNING)
)
_LINE_SQL = f"""
SELECT COALESCE(SUM(CASE WHEN item.job_id IS NULL AND job.parent_id IS NULL THEN 1 ELSE 0 END), 0),
       COALESCE(SUM(CASE WHEN job.priority = %s AND job.status = {_PENDING} THEN 1 ELSE 0 END), 0),
       COALESCE(SUM(CASE WHEN job.priority = %s AND job.status = {_QUEUED} THEN 1 ELSE 0 END), 0)
FROM {_JOBS} job LEFT JOIN {_BATCH_ITEMS} item ON item.job_id = job.id
WHERE job.tenant_id = %s AND job.status IN ({_PENDING}, {_QUEUED}, {_RUNNING})
"""

# What a release needs to know, and no more: whether a job is pending, and
# whether the queued ones fill the broker slots. Each count stops at what
# decides (a LIMIT), so a look costs the same beside a batch of 10,000 pending
# items as beside one job (232 buffers read at 355 waiting, against 7).
_WAITING_SQL = f"""
SELECT (SELECT COUNT(*) FROM (SELECT 1 FROM {_JOBS}
          WHERE tenant_id = %s AND priority = %s AND status = {_PENDING} LIMIT 1) AS pending),
       (SELECT COUNT(*) FROM (SELECT 1 FROM {_JOBS}
          WHERE tenant_id = %s AND priority = %s AND status = {_QUEUED} LIMIT %s) AS queued)
"""


def line_statement(*, tenant_id: int, priority: str) -> Statement:
    """The tenant's line: (single jobs in flight of every priority, pending of
    `priority`, queued of `priority`), read by `line_from_rows`; run with other
    statements (`chorus.statements`)."""
    return Statement(_LINE_SQL, [priority, priority, tenant_id], "tenant_line")


def line_from_rows(rows: Rows | None) -> tuple[int, int, int]:
    assert rows is not None
    [(in_flight, pending_n, queued_n)] = rows
    return int(in_flight), int(pending_n), int(queued_n)


def waiting_statement(*, tenant_id: int, priority: str, slots: int) -> Statement:
    """The tenant's (pending, queued) jobs at `priority`, read by `waiting_from_rows`;
    pending counted up to 1, queued up to `slots`."""
    return Statement(
        _WAITING_SQL, [tenant_id, priority, tenant_id, priority, slots], "tenant_waiting"
    )


def waiting_from_rows(rows: Rows | None) -> tuple[int, int]:
    assert rows is not None
    [(pending_n, queued_n)] = rows
    return int(pending_n), int(queued_n)


def count_waiting(*, tenant_id: int, priority: str, slots: int) -> tuple[int, int]:
    """(pending, queued) jobs of the tenant at `priority`, up to 1 and `slots`."""
    [rows] = execute_together(
        [waiting_statement(tenant_id=tenant_id, priority=priority, slots=slots)]
    )
    return waiting_from_rows(rows)
