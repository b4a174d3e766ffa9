"""Pruning of old job rows, so the tables stop growing with the service's age.

A job finished more than `JOB_ROW_RETENTION_DAYS` ago is deleted with what hangs
off it: its ledger entries and its Idempotency-Key (long forgotten by then).
What billing needs is kept: each `UsagePeriod` holds the period's characters,
jobs by outcome and audio, moved by the services as each job settled, so usage
of a past period reads the same after its jobs are gone. The setting's floor
(40 days) keeps every row a period recount or the admin's 30-day chart reads.

Never pruned:
- a job not finished (its `finished_at` is empty, so it is outside the index);
- a job whose audio is still in the bucket (a plan may keep audio longer than
  the rows): it goes once expiry has deleted the object and marked the row.

Each batch is one set-based DELETE per table of ids read off the partial index
`job_prunable` (oldest first, LIMIT), with every foreign key to a job applied the
way its `on_delete` says (rows that hang off it deleted, references from other
jobs set to NULL), and a pass stops after `PRUNE_BUDGET`, so a
backlog (a horizon shortened, a sweeper that was down) is worked off over
several passes, never in one long transaction.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import cast

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import models, transaction
from django.db.models import ForeignObjectRel, Q
from django.utils import timezone

from synthesis.models import Job

# Rows one DELETE removes: small enough that a batch's locks and WAL stay short.
PRUNE_BATCH = 1000
# Wall time one sweeper pass spends pruning at most (a batch started is finished).
PRUNE_BUDGET = timedelta(seconds=1)

# What `job_prunable` indexes: finished, and no audio left in the bucket.
PRUNABLE = Q(status__in=["failed", "cancelled"]) | Q(
    status="succeeded", output_deleted_at__isnull=False
)


def prune_horizon(*, now: datetime | None = None) -> datetime:
    return (now or timezone.now()) - timedelta(days=settings.JOB_ROW_RETENTION_DAYS)


def jobs_prune_batch(*, before: datetime, batch: int = PRUNE_BATCH) -> int:
    """Delete up to `batch` prunable jobs finished before `before`, oldest first,
    with their ledger entries and Idempotency-Keys; returns how many."""
    # `created_at` too: a job is charged to the period it was made in, and that
    # period must be past its recounts (a job finishes after it is made, so this
    # only matters for a row whose times were changed by hand).
    due = (
        Job.objects.filter(PRUNABLE, finished_at__lt=before, created_at__lt=before)
        .order_by("finished_at")
        .select_for_update(skip_locked=True)  # rows another sweeper holds are its own
    )
    with transaction.atomic():
        ids = list(due.values_list("pk", flat=True)[:batch])
        if not ids:
            return 0
        for relation in job_relations():
            model = cast(type[models.Model], relation.related_model)
            rows = model._base_manager.filter(**{f"{relation.field.name}__in": ids})
            if relation.on_delete is models.CASCADE:
                rows.delete()  # ledger entries, Idempotency-Keys: one DELETE each
            else:
                rows.update(**{relation.field.name: None})
        # `_raw_delete`: one DELETE by id; `delete()` would first load every row
        # to apply `on_delete`, which the statements above have done.
        deleted: int = Job.objects.filter(pk__in=ids)._raw_delete(Job.objects.db)
    return deleted


def job_relations() -> list[ForeignObjectRel]:
    """Every foreign key to a job, hidden ones (`related_name="+"`) included: each
    is applied by hand, set-based, as `Model.delete()` would one row at a time."""
    relations = [
        field
        for field in Job._meta.get_fields(include_hidden=True)
        if isinstance(field, ForeignObjectRel) and not field.many_to_many
    ]
    for relation in relations:
        if relation.on_delete not in (models.CASCADE, models.SET_NULL):
            raise ImproperlyConfigured(f"pruning jobs cannot apply {relation}'s on_delete")
    return relations


def jobs_prune(
    *,
    now: datetime | None = None,
    batch: int = PRUNE_BATCH,
    budget: timedelta = PRUNE_BUDGET,
) -> int:
    """Prune batches of old job rows until none is left or the pass's time budget
    is spent; returns how many rows went."""
    before = prune_horizon(now=now)
    stop = time.monotonic() + budget.total_seconds()
    pruned = 0
    while True:
        n = jobs_prune_batch(before=before, batch=batch)
        pruned += n
        if n < batch or time.monotonic() >= stop:
            return pruned
