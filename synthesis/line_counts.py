"""A tenant's jobs in flight, counted in plain SQL.

These counts run on every submit (under the tenant's lock) and after every claim
(the look for a pending job to release). Built with the ORM (an aggregate with filtered
counts) each cost the web process more CPU than PostgreSQL spent running it, so
they are written out here, once, in SQL that PostgreSQL and SQLite both run.

None of them reads the tenant's whole line: a batch can hold thousands of items
in flight, and a count under the tenant's lock that read each of them would
make every submit of that tenant wait on it.
"""

from __future__ import annotations

from chorus.statements import Rows, Statement
from synthesis.models import Job, JobStatus

_JOBS = Job._meta.db_table

# The statuses are written into the text (they never change), the tenant and
# priority passed: both are prepared statements (`chorus.statements`).
_PENDING, _QUEUED, _RUNNING = (
    f"'{status.value}'" for status in (JobStatus.PENDING, JobStatus.QUEUED, JobStatus.RUNNING)
)


# Whether a job of the tenant's is pending at a priority, and its queued jobs
# there up to the broker slots: what admission and a release decide by, and no
# more. Each count stops at what decides (a LIMIT): at 355 waiting jobs of one
# tenant, 7 buffers read instead of 232. Each is ordered as the waiting index
# (`job_waiting`) is: without an order, the plan kept for a prepared statement
# (made without knowing the priority) took a LIMIT over the table's rows as
# cheap and read all 100,000 of a tenant whose batch waited at another
# priority (13 ms). Parameters: tenant, priority, tenant, priority, slots.
def _pending_and_queued(*, tenant: str, priority: str) -> str:
    return f"""
(SELECT COUNT(*) FROM (SELECT 1 FROM {_JOBS}
   WHERE tenant_id = {tenant} AND priority = {priority} AND status = {_PENDING}
   ORDER BY created_at LIMIT 1) AS pending),
(SELECT COUNT(*) FROM (SELECT 1 FROM {_JOBS}
   WHERE tenant_id = {tenant} AND priority = {priority} AND status = {_QUEUED}
   ORDER BY created_at LIMIT %s) AS queued)
"""


_PENDING_AND_QUEUED = _pending_and_queued(tenant="%s", priority="%s")

# The tenant's single jobs in flight, of every priority (the plan's jobs at once
# leave a batch's items and a long text's segments out:
# `synthesis.selectors.jobs_in_flight`), off the partial index
# `job_single_in_flight`, whose condition this repeats word for word (SQLite
# matches a partial index's condition term by term). A plan caps these at its
# jobs at once (4 to 64 as seeded).
_LINE_SQL = f"""
SELECT (SELECT COUNT(*) FROM {_JOBS}
          WHERE tenant_id = %s AND (NOT "in_batch" AND "parent_id" IS NULL
                AND "status" IN ({_PENDING}, {_QUEUED}, {_RUNNING}))) AS in_flight,
{_PENDING_AND_QUEUED}
"""

_WAITING_SQL = f"SELECT {_PENDING_AND_QUEUED}"

# The same for the tenant and priority of one job, by its id: the look after a
# claim, sent in the claim's round trip before the claimed row is read back
# (`synthesis.services.execution`). Parameters: slots, the job's id.
_WAITING_OF_JOB_SQL = (
    f"SELECT {_pending_and_queued(tenant='job.tenant_id', priority='job.priority')}"
    f" FROM {_JOBS} job WHERE job.id = %s"
)


def line_statement(*, tenant_id: int, priority: str, slots: int) -> Statement:
    """The tenant's line: (single jobs in flight of every priority, pending of
    `priority` up to 1, queued of `priority` up to `slots`), read by
    `line_from_rows`; run with other statements (`chorus.statements`)."""
    return Statement(
        _LINE_SQL, [tenant_id, tenant_id, priority, tenant_id, priority, slots], "tenant_line"
    )


def line_from_rows(rows: Rows | None) -> tuple[int, int, int]:
    assert rows is not None
    [(in_flight, pending_n, queued_n)] = rows
    return int(in_flight), int(pending_n), int(queued_n)


def waiting_statement(*, tenant_id: int, priority: str, slots: int) -> Statement:
    """The tenant's (pending, queued) jobs at `priority`, up to 1 and `slots`,
    read by `waiting_from_rows`."""
    return Statement(
        _WAITING_SQL, [tenant_id, priority, tenant_id, priority, slots], "tenant_waiting"
    )


def waiting_of_job_statement(*, job_id: object, slots: int) -> Statement:
    """`waiting_statement` for the tenant and priority of the job `job_id` (no
    row: the job does not exist)."""
    return Statement(_WAITING_OF_JOB_SQL, [slots, job_id], "job_tenant_waiting")


def waiting_from_rows(rows: Rows | None) -> tuple[int, int]:
    assert rows is not None
    [(pending_n, queued_n)] = rows
    return int(pending_n), int(queued_n)
