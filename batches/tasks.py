"""Celery tasks of batches: interfaces only."""

from __future__ import annotations

import uuid
from typing import Any

from celery import shared_task

from batches.archive import batch_archive_build
from batches.cancelling import batch_cancel_finish
from batches.publishers import send_batch_archive, send_batch_cancel_finish


# Routed to the light queue (`CELERY_TASK_ROUTES`): building an archive needs no engine.
@shared_task(name="batches.build_archive")
def build_archive_task(batch_id: str) -> dict[str, Any]:
    return {"batch_id": batch_id, "status": batch_archive_build(batch_id=batch_id)}


# The end of a cancelled batch (`batches.cancelling`), on the light queue too.
@shared_task(name="batches.finish_cancel")
def finish_cancel_task(batch_id: str) -> dict[str, Any]:
    return {"batch_id": batch_id, "ended": batch_cancel_finish(batch_id=uuid.UUID(batch_id))}


# The senders batch services call (`batches.publishers`).
send_batch_archive.register(lambda batch_id: build_archive_task.apply_async(args=(batch_id,)))
send_batch_cancel_finish.register(lambda batch_id: finish_cancel_task.apply_async(args=(batch_id,)))
