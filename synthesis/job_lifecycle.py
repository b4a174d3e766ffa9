"""Every status change of a speech job: the transitions as data, and the
functions that make them.

A status changes only through `TRANSITIONS`: a job is created in a status an
event allows (`created_status`), and a change is a conditional UPDATE whose
condition is the event's from-statuses (`job_transition` for one job,
`jobs_transition` for a set). The worker's written-out statements (the claim,
an attempt's own writes, fair admission's release: `synthesis.job_rows`) and a
batch cancel's chunked UPDATE (`batches.cancelling`) take their SET and WHERE
from `transition_sql`, off the same table. `docs/job-lifecycle.md` is drawn
from it (`manage.py job_lifecycle --write`).

What follows a change (events, refunds, streams) stays with its caller: the
UPDATE's row count says whether this caller made the change, and only that
caller acts on it (two racing writers never both do).
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db.models import Q, QuerySet

from synthesis.models import Job, JobStatus


class Event(enum.StrEnum):
    HELD = "held"
    ADMITTED = "admitted"
    LONGFORM_ADMITTED = "longform_admitted"
    REUSED = "reused"
    RELEASED = "released"
    CLAIMED = "claimed"
    RETRIED = "retried"
    REQUEUED = "requeued"
    PUBLISH_FAILED = "publish_failed"
    GAVE_UP = "gave_up"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    JOINED = "joined"
    LONGFORM_FAILED = "longform_failed"
    LONGFORM_CANCELLED = "longform_cancelled"


@dataclass(frozen=True)
class Transition:
    sources: tuple[JobStatus, ...]  # () for a job created in `target`
    target: JobStatus
    why: str  # what makes it, for the diagram

    @property
    def creates(self) -> bool:
        return not self.sources


S = JobStatus
TRANSITIONS: dict[Event, Transition] = {
    Event.HELD: Transition((), S.PENDING, "admitted, the tenant's broker slots full"),
    Event.ADMITTED: Transition((), S.QUEUED, "admitted into a free broker slot"),
    Event.LONGFORM_ADMITTED: Transition(
        (), S.RUNNING, "a long text's parent, waiting for its segments"
    ),
    Event.REUSED: Transition((), S.SUCCEEDED, "an earlier identical result copied"),
    Event.RELEASED: Transition((S.PENDING,), S.QUEUED, "a broker slot of its tenant freed"),
    # `running` too: the same message redelivered after its worker died, the new
    # attempt superseding the dead one.
    Event.CLAIMED: Transition((S.QUEUED, S.RUNNING), S.RUNNING, "a worker's claim"),
    Event.RETRIED: Transition((S.RUNNING,), S.QUEUED, "storage unavailable, retried later"),
    Event.REQUEUED: Transition((S.RUNNING,), S.QUEUED, "its worker died, drained or got stuck"),
    Event.PUBLISH_FAILED: Transition((S.QUEUED,), S.FAILED, "the broker refused its message"),
    Event.GAVE_UP: Transition(
        (S.PENDING, S.QUEUED, S.RUNNING), S.FAILED, "every attempt's worker lost"
    ),
    Event.SUCCEEDED: Transition((S.RUNNING,), S.SUCCEEDED, "its attempt stored the audio"),
    Event.FAILED: Transition((S.RUNNING,), S.FAILED, "the engine or storage failed"),
    Event.CANCELLED: Transition(
        (S.PENDING, S.QUEUED, S.RUNNING),
        S.CANCELLED,
        "cancelled by its tenant, its batch or its long text",
    ),
    Event.JOINED: Transition((S.RUNNING,), S.SUCCEEDED, "a long text's segments joined"),
    Event.LONGFORM_FAILED: Transition((S.RUNNING,), S.FAILED, "a long text's segment failed"),
    Event.LONGFORM_CANCELLED: Transition(
        (S.RUNNING,), S.CANCELLED, "a long text cancelled before its join"
    ),
}
del S


class IllegalTransition(ValueError):
    """A change the table does not hold: a bug in the caller, never bad input."""


def created_status(event: Event) -> JobStatus:
    """The status a job is created in by `event`."""
    transition = TRANSITIONS[event]
    if not transition.creates:
        raise IllegalTransition(f"{event} changes a job; it does not create one")
    return transition.target


def _sources(event: Event, statuses: Iterable[str] | None) -> tuple[str, ...]:
    """The from-statuses of `event`, or the part `statuses` names of them."""
    transition = TRANSITIONS[event]
    if transition.creates:
        raise IllegalTransition(f"{event} creates a job; it changes none")
    if statuses is None:
        return tuple(transition.sources)
    chosen = tuple(statuses)
    if not chosen or not set(chosen) <= set(transition.sources):
        raise IllegalTransition(
            f"{event} moves jobs from {', '.join(transition.sources)}, not {', '.join(chosen)}"
        )
    return chosen


def job_transition(
    *, event: Event, job_id: uuid.UUID | str, where: Q | None = None, **values: Any
) -> int:
    """Move the job by `event` if it is in one of the event's from-statuses (and
    matches `where`), setting `values` with it; 1 if this call moved it, else 0."""
    return jobs_transition(event=event, jobs=Job.objects.filter(pk=job_id), where=where, **values)


def jobs_transition(
    *,
    event: Event,
    jobs: QuerySet[Job],
    statuses: Iterable[str] | None = None,
    where: Q | None = None,
    **values: Any,
) -> int:
    """Move every job of `jobs` that is in the event's from-statuses (or the part
    of them `statuses` names) by `event`, in one UPDATE; how many moved."""
    if "status" in values:
        raise IllegalTransition("the event sets the status")
    chosen = jobs.filter(status__in=_sources(event, statuses))
    if where is not None:
        chosen = chosen.filter(where)
    return chosen.update(status=TRANSITIONS[event].target, **values)


@dataclass(frozen=True)
class TransitionSQL:
    """An event as SQL on the jobs table, statuses as literals (prepared
    statements keep their partial indexes only when the text names them)."""

    set: str  # "status = 'running'"
    where: str  # "status IN ('queued', 'running')"
    where_of: str  # the same on `{table}.status`, for statements with a join or subquery


def transition_sql(event: Event, *, statuses: Iterable[str] | None = None) -> TransitionSQL:
    sources = ", ".join(f"'{status}'" for status in _sources(event, statuses))
    table = Job._meta.db_table
    return TransitionSQL(
        set=f"status = '{TRANSITIONS[event].target}'",
        where=f"status IN ({sources})",
        where_of=f"{table}.status IN ({sources})",
    )


def lifecycle_mermaid() -> str:
    """The state diagram of `TRANSITIONS` (Mermaid)."""
    lines = ["stateDiagram-v2"]
    for event, transition in TRANSITIONS.items():
        label = f"{event} ({transition.why})"
        for source in transition.sources or ("[*]",):
            lines.append(f"    {source} --> {transition.target}: {label}")
    for status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED):
        lines.append(f"    {status} --> [*]")
    return "\n".join(lines) + "\n"


LIFECYCLE_DOC = "docs/job-lifecycle.md"


def lifecycle_doc() -> str:
    """docs/job-lifecycle.md as `TRANSITIONS` has it (`manage.py job_lifecycle`)."""
    rows = "\n".join(
        f"| `{event}` | {', '.join(f'`{s}`' for s in t.sources) or 'created'} "
        f"| `{t.target}` | {t.why} |"
        for event, t in TRANSITIONS.items()
    )
    return (
        "# A speech job's lifecycle\n\n"
        "<!-- Written by `python manage.py job_lifecycle --write` from\n"
        "     synthesis/job_lifecycle.py (TRANSITIONS); a test checks they agree. -->\n\n"
        "Every status change of a job is one of these events, made by a conditional\n"
        "UPDATE on the event's from-statuses (`synthesis.job_lifecycle`): of two\n"
        "writers racing for one job, one changes it and the other finds nothing to do.\n"
        "A long text's parent job is created `running` and never goes to a worker; its\n"
        "segments are jobs of their own and take the ordinary path.\n\n"
        f"```mermaid\n{lifecycle_mermaid()}```\n\n"
        "| event | from | to | when |\n| --- | --- | --- | --- |\n"
        f"{rows}\n"
    )
