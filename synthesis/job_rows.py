"""Job rows as a worker writes them, in plain SQL: the claim, what the running
attempt stamps on its job, and the release of a tenant's next pending jobs.

A worker writes job rows a few times per job (the claim, the first audio's
stamp, the final state, and under a backlog the release of the next job). Built
with the ORM, each statement cost the worker more CPU than PostgreSQL spent
running it; the claim took a second query to read back the row it had just
changed, and the release four. Here they are written out once, in SQL
that PostgreSQL and SQLite (3.35+, for RETURNING) both run; values go through
the fields' own conversion, and rows come back through the converters a query
would apply, worked out once per connection (`raw` works them out again for
every query).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Field, JSONField

from chorus.db_clock import db_timestamp, now_sql
from chorus.disk_wait import UNFLUSHED
from chorus.statements import COMMIT, Rows, Statement, execute_together, model_from_row
from synthesis.job_lifecycle import Event, transition_sql
from synthesis.models import Job, JobStatus
from tenants.models import Tenant

_JOBS = Job._meta.db_table
_TENANTS = Tenant._meta.db_table
_OVERRIDES = Tenant._meta.get_field("limit_overrides")
assert isinstance(_OVERRIDES, JSONField)
_FIELDS = Job._meta.concrete_fields
_COLUMNS = ", ".join(connection.ops.quote_name(f.column) for f in _FIELDS)

# What the worker needs of the job's tenant rides along: its bucket (set at
# creation, never changed) and its limit overrides (whether its audio is
# signed), so that a job's run asks the database nothing more between its
# stamps, each of which waits out an outage (`services.execution.through_outage`).
# Statuses are written into the text: these are prepared statements
# (`chorus.statements`), and a generic plan uses a partial index only where the
# text implies its condition. Status changes come from `synthesis.job_lifecycle`.
_PENDING, _QUEUED = (f"'{status.value}'" for status in (JobStatus.PENDING, JobStatus.QUEUED))
_CLAIM = transition_sql(Event.CLAIMED)
_CLAIM_SQL = f"""
UPDATE {_JOBS}
SET {_CLAIM.set}, attempts = attempts + 1, started_at = {now_sql()}, worker = %s
WHERE id = %s AND {_CLAIM.where} AND attempts < %s {{epoch}} {{guards}}
RETURNING {_COLUMNS},
    (SELECT t.bucket FROM {_TENANTS} t WHERE t.id = {_JOBS}.tenant_id) AS tenant_bucket,
    (SELECT t.limit_overrides FROM {_TENANTS} t WHERE t.id = {_JOBS}.tenant_id) AS tenant_overrides
"""


# Conditions the apps above add to every claim, as SQL on the job's row (a
# cancelled batch's items are refused: `batches.cancelling`). Registered when the
# apps are ready, before any claim: the claim's text, a prepared statement's,
# never changes afterwards.
_claim_guards: list[str] = []


def claim_guard_register(sql: str) -> None:
    if sql not in _claim_guards:
        _claim_guards.append(sql)


# The claim's commit does not wait for its WAL to reach the disk. A claim that a
# crash of PostgreSQL loses is a claim never made: the job is `queued` again, the
# running attempt finds at its first stamp that it does not own the job and
# stops, and the job is sent again (`jobs_republish_lost_messages`). On the way
# to a stream's first audio this saves waiting for the flush (about 0.4 ms on
# an idle 2-core host). Hence `UNFLUSHED` first in the claim's string.


def job_row_claim(
    *,
    job_id: uuid.UUID | str,
    worker: str,
    max_attempts: int,
    epoch: int | None,
    then: Sequence[Statement] = (),
) -> tuple[Job | None, list[Rows | None]]:
    """Mark the job running for one more attempt and return its row as changed;
    None when it is not queued or running, is worn out, or `epoch` is not its own.
    `started_at` is the database's time (`chorus.db_clock`), not this host's.

    `then`: statements to run once the claim is committed, in the same round
    trip; their rows come back with the job. They must not fail: an error in
    them raises although the claim stands (a retry then claims the job again,
    one attempt more, as after a connection lost between a claim's commit and
    its answer). Its `tenant` is loaded with the bucket and limit overrides only
    (other fields load on access)."""
    sql = _CLAIM_SQL.format(
        epoch="AND epoch = %s" if epoch is not None else "",
        guards="".join(f"AND {guard} " for guard in _claim_guards),
    )
    params = [
        worker,
        _prep("id", job_id),
        max_attempts,
        *([epoch] if epoch is not None else []),
    ]
    name = "job_claim" if epoch is None else "job_claim_epoch"
    claim = Statement(sql, params, name)
    if connection.vendor == "postgresql" and not connection.in_atomic_block:
        # One string, one round trip: the claim's transaction, ended by the
        # COMMIT in it, then `then` in a transaction of its own.
        _, rows, _, *after = execute_together([UNFLUSHED, claim, COMMIT, *then])
    else:
        # SQLite commits each statement on its own; inside a caller's
        # transaction the claim commits with it.
        rows, *after = execute_together([claim, *then])
    if not rows:
        return None, after
    [row] = rows
    (job,) = _jobs([row])
    bucket, overrides = row[len(_FIELDS) : len(_FIELDS) + 2]
    overrides = _OVERRIDES.from_db_value(overrides, _OVERRIDES.get_col(_TENANTS), connection)
    job.tenant = Tenant.from_db(
        connection.alias, ["id", "bucket", "limit_overrides"], [job.tenant_id, bucket, overrides]
    )
    return job, after


# What an attempt's own writes require of its job: still running (a claim's
# to-status), under no newer attempt.
_OWNED = transition_sql(Event.SUCCEEDED)


def job_row_update_owned(*, job_id: uuid.UUID | str, attempt: int, **values: Any) -> int:
    """Set `values` (field names) on the job if `attempt` still owns it (it is
    running, and no newer attempt took it over); how many rows changed (0 or 1)."""
    assert "status" not in values, "a status changes by its event"
    columns = ", ".join(f"{connection.ops.quote_name(_field(name).column)} = %s" for name in values)
    params = [_prep(name, value) for name, value in values.items()]
    params += [_prep("id", job_id), attempt]
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {_JOBS} SET {columns} WHERE id = %s AND attempts = %s AND {_OWNED.where}",
            params,
        )
        return int(cursor.rowcount)


def job_row_stamp_owned(
    *,
    job_id: uuid.UUID | str,
    attempt: int,
    stamp: str,
    event: Event | None = None,
    **values: Any,
) -> datetime | None:
    """As `job_row_update_owned`, and set the timestamp field `stamp` to the
    database's time (`chorus.db_clock`): the time written, or None when `attempt`
    no longer owns the job. With an `event`, the job moves by it (it ends)."""
    assert "status" not in values, "a status changes by its event"
    # Owned means running: the from-status of every event an attempt ends its job by.
    change = transition_sql(event) if event is not None else _OWNED
    columns = [f"{connection.ops.quote_name(_field(stamp).column)} = {now_sql()}"]
    columns += [f"{connection.ops.quote_name(_field(name).column)} = %s" for name in values]
    columns += [change.set] if event is not None else []
    params = [_prep(name, value) for name, value in values.items()]
    params += [_prep("id", job_id), attempt]
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {_JOBS} SET {', '.join(columns)} "
            f"WHERE id = %s AND attempts = %s AND {change.where} "
            f"RETURNING {connection.ops.quote_name(_field(stamp).column)}",
            params,
        )
        row = cursor.fetchone()
    return db_timestamp(row[0]) if row else None


# The tenant's oldest pending jobs of a priority, as many as its free broker
# slots (counted in this statement, so after the caller's tenant lock: nothing
# admitted meanwhile is missed), moved to `queued` under a new epoch and stamped
# as published, in one statement that returns them. The jobs are picked once, in
# a materialized CTE: written as `id IN (... LIMIT ...)`, PostgreSQL released
# more jobs than the limit. PostgreSQL skips rows another transaction holds (a
# cancel in progress): waiting on them while holding the tenant lock is how
# deadlocks start. SQLite has no row locks (nor the clause).
_RELEASE = transition_sql(Event.RELEASED)
_RELEASE_SQL = f"""
WITH picked AS MATERIALIZED (
    SELECT id FROM {_JOBS}
    WHERE tenant_id = %s AND priority = %s AND status = {_PENDING}
    ORDER BY created_at, id
    LIMIT (
        SELECT CASE WHEN COUNT(*) < %s THEN %s - COUNT(*) ELSE 0 END FROM {_JOBS}
        WHERE tenant_id = %s AND priority = %s AND status = {_QUEUED}
    )
    {{lock}}
)
UPDATE {_JOBS} SET {_RELEASE.set}, epoch = epoch + 1, published_at = %s
WHERE {_RELEASE.where} AND id IN (SELECT id FROM picked)
RETURNING {_COLUMNS}
"""


def jobs_row_release(*, tenant_id: int, priority: str, slots: int, now: datetime) -> list[Job]:
    """Release the tenant's oldest pending jobs of `priority` into its free broker
    slots (`slots` at most queued at once); the released jobs, oldest first.
    Call under the tenant's lock."""
    lock = "FOR NO KEY UPDATE SKIP LOCKED" if connection.vendor == "postgresql" else ""
    params: list[Any] = [tenant_id, priority, slots, slots, tenant_id, priority]
    params += [_prep("published_at", now)]
    [rows] = execute_together([Statement(_RELEASE_SQL.format(lock=lock), params, "jobs_release")])
    released = _jobs(rows or [])
    # Published oldest first: the broker hands them out in publish order.
    return sorted(released, key=lambda job: (job.created_at, job.pk))


def _jobs(rows: Iterable[Sequence[Any]]) -> list[Job]:
    """Jobs from rows that start with every column of `_COLUMNS`, in its order."""
    return [model_from_row(Job, row[: len(_FIELDS)]) for row in rows]


def _field(name: str) -> Field:  # type: ignore[type-arg]
    field = Job._meta.get_field(name)
    assert isinstance(field, Field)
    return field


def _prep(name: str, value: object) -> Any:
    return _field(name).get_db_prep_save(value, connection)
