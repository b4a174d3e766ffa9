"""A finished job may be the last of its batch: look once its state is committed."""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction
from django.dispatch import receiver

from batches.models import Batch, BatchItem
from batches.services import batch_settle
from batches.sweeper import batches_sweep
from synthesis.signals import job_finished, sweep_finished

# Written out: it runs for every job that ends, and the ORM's query (joined to
# the batch for the items' default ordering) cost more CPU than the statement.
_BATCH_OF_SQL = f"SELECT batch_id FROM {BatchItem._meta.db_table} WHERE job_id = %s"


@receiver(job_finished)
def _settle_batch_of(*, job: Any, **kwargs: Any) -> None:
    if job.is_segment:  # a part of a long text, never a batch's item itself
        return
    job_id = job.pk

    def settle() -> None:
        job_key = BatchItem._meta.get_field("job").get_db_prep_value(job_id, connection)
        with connection.cursor() as cursor:
            cursor.execute(_BATCH_OF_SQL, [job_key])
            found = cursor.fetchone()
        if found is not None:
            batch_settle(batch_id=Batch._meta.pk.to_python(found[0]))  # type: ignore[union-attr]

    # After commit: two items finishing at once each see the other's final state
    # only then, so the later of the two always finds the batch complete.
    transaction.on_commit(settle)


@receiver(sweep_finished)
def _sweep_batches(**kwargs: Any) -> None:
    batches_sweep()
