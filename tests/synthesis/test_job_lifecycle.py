"""A job's status changes only by the events of `synthesis.job_lifecycle`, and
the committed diagram is the one its table draws."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.db.models import Q

from synthesis.job_lifecycle import (
    LIFECYCLE_DOC,
    TRANSITIONS,
    Event,
    IllegalTransition,
    created_status,
    job_transition,
    jobs_transition,
    lifecycle_doc,
    transition_sql,
)
from synthesis.models import Job, JobStatus
from tests.conftest import Persona

ROOT = Path(__file__).resolve().parents[2]
APPS = ("chorus", "tenants", "synthesis", "quotas", "batches", "webhooks")


def _job(persona: Persona, event: Event = Event.ADMITTED) -> Job:
    return Job.objects.create(
        tenant=persona.tenant, text="Hello.", characters=6, status=created_status(event)
    )


def test_the_committed_diagram_is_the_one_the_transitions_draw() -> None:
    # After a change to TRANSITIONS: python manage.py job_lifecycle --write
    assert (ROOT / LIFECYCLE_DOC).read_text() == lifecycle_doc()


def test_every_status_is_reached_and_every_unfinished_one_left() -> None:
    targets = {t.target for t in TRANSITIONS.values()}
    sources = {s for t in TRANSITIONS.values() for s in t.sources}
    assert targets == set(JobStatus)
    assert sources == {JobStatus.PENDING, JobStatus.QUEUED, JobStatus.RUNNING}


# Calls that name a status without writing it: lookups, and the events that say
# a job ended (`synthesis.job_events`).
READS = {"filter", "exclude", "get", "Q", "job_finished", "job_finished_by_id"}


def _status_writes(path: Path) -> list[str]:
    """Writes of a job's status outside the lifecycle: `status=JobStatus.X` given to
    anything but a lookup (an update, a create, a new Job, a helper that writes),
    and SQL that sets a status."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        text = node.value if isinstance(node, ast.Constant) else None
        if isinstance(text, str) and "set status" in " ".join(text.lower().split()):
            found.append(f"{path}:{node.lineno}: SQL sets a status")
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        for keyword in node.keywords:
            value = keyword.value
            if (
                keyword.arg == "status"
                and name not in READS
                and isinstance(value, ast.Attribute)
                and isinstance(value.value, ast.Name)
                and value.value.id == "JobStatus"
            ):
                found.append(f"{path}:{node.lineno}: {name}(status=JobStatus.{value.attr})")
    return found


def test_no_module_but_the_lifecycle_writes_a_jobs_status() -> None:
    modules = [
        path
        for app in APPS
        for path in (ROOT / app).rglob("*.py")
        if "migrations" not in path.parts and path != ROOT / "synthesis" / "job_lifecycle.py"
    ]
    assert modules
    assert [write for path in modules for write in _status_writes(path)] == []


def test_the_scan_finds_a_status_written_past_the_lifecycle(tmp_path: Path) -> None:
    module = tmp_path / "rogue.py"
    module.write_text(
        "Job.objects.filter(status=JobStatus.QUEUED).update(status=JobStatus.FAILED)\n"
        "_owned_stamp(claim, 'finished_at', status=JobStatus.SUCCEEDED)\n"
        'cursor.execute("UPDATE synthesis_job SET  status = %s")\n'
    )
    assert len(_status_writes(module)) == 3


@pytest.mark.django_db
@pytest.mark.embedded
def test_a_transition_moves_only_a_job_in_one_of_its_from_statuses(alice: Persona) -> None:
    job = _job(alice)
    assert job_transition(event=Event.SUCCEEDED, job_id=job.pk) == 0  # queued, not running
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED
    assert job_transition(event=Event.CLAIMED, job_id=job.pk, worker="w:1") == 1
    job.refresh_from_db()
    assert (job.status, job.worker) == (JobStatus.RUNNING, "w:1")


@pytest.mark.django_db
@pytest.mark.embedded
def test_a_transition_takes_its_callers_condition_too(alice: Persona) -> None:
    job = _job(alice)
    assert job_transition(event=Event.CANCELLED, job_id=job.pk, where=~_tenant(alice)) == 0
    assert job_transition(event=Event.CANCELLED, job_id=job.pk, where=_tenant(alice)) == 1
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED


def _tenant(persona: Persona) -> Q:
    return Q(tenant=persona.tenant)


@pytest.mark.django_db
@pytest.mark.embedded
def test_a_bulk_transition_moves_the_part_of_its_from_statuses_it_names(alice: Persona) -> None:
    waiting, queued = _job(alice, Event.HELD), _job(alice)
    jobs = Job.objects.filter(pk__in=[waiting.pk, queued.pk])
    assert jobs_transition(event=Event.CANCELLED, jobs=jobs, statuses=[JobStatus.PENDING]) == 1
    statuses = dict(jobs.values_list("pk", "status"))
    assert statuses == {waiting.pk: JobStatus.CANCELLED, queued.pk: JobStatus.QUEUED}


def test_a_change_the_table_does_not_hold_is_refused() -> None:
    with pytest.raises(IllegalTransition):
        jobs_transition(event=Event.RELEASED, jobs=Job.objects.none(), statuses=["running"])
    with pytest.raises(IllegalTransition):
        transition_sql(Event.CANCELLED, statuses=["succeeded"])
    with pytest.raises(IllegalTransition):
        created_status(Event.CLAIMED)
    with pytest.raises(IllegalTransition):
        job_transition(event=Event.ADMITTED, job_id="00000000-0000-0000-0000-000000000000")
    with pytest.raises(IllegalTransition):
        job_transition(event=Event.FAILED, job_id=1, status=JobStatus.SUCCEEDED)


def test_written_out_sql_names_the_events_statuses() -> None:
    claim = transition_sql(Event.CLAIMED)
    assert claim.set == "status = 'running'"
    assert claim.where == "status IN ('queued', 'running')"
