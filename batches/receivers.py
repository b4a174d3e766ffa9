"""A finished job may be the last of its batch: look once its state is committed."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.dispatch import receiver

from batches.models import BatchItem
from batches.services import batch_settle
from batches.sweeper import batches_sweep
from synthesis.signals import job_finished, sweep_finished


@receiver(job_finished)
def _settle_batch_of(*, job: Any, **kwargs: Any) -> None:
    if job.is_segment:  # a part of a long text, never a batch's item itself
        return
    job_id = job.pk

    def settle() -> None:
        batch_id = BatchItem.objects.filter(job_id=job_id).values_list("batch_id", flat=True)
        for found in batch_id:
            batch_settle(batch_id=found)

    # After commit: two items finishing at once each see the other's final state
    # only then, so the later of the two always finds the batch complete.
    transaction.on_commit(settle)


@receiver(sweep_finished)
def _sweep_batches(**kwargs: Any) -> None:
    batches_sweep()
