"""What follows a batch's end, once the transaction that ended it committed:
the `batch_completed` signal (webhooks send `batch.completed`) and its archive."""

from __future__ import annotations

import logging
import uuid

from batches.models import ArchiveStatus, Batch
from batches.publishers import send_batch_archive
from batches.signals import batch_completed

log = logging.getLogger(__name__)


def batch_ended(*, batch_id: uuid.UUID) -> None:
    batch = Batch.objects.get(pk=batch_id)
    # Robust: a webhook receiver that fails must not keep the archive from being built.
    for receiver, answer in batch_completed.send_robust(
        sender=Batch, batch=batch, status=batch.status
    ):
        if isinstance(answer, Exception):
            log.error("batch_completed receiver %r failed", receiver, exc_info=answer)
    try:
        send_batch_archive(str(batch_id))
    except Exception:
        # The batch has ended either way; the archive is marked failed and can be
        # built again (see `batch_archive_build`).
        log.exception("could not enqueue the archive of batch %s", batch_id)
        Batch.objects.filter(pk=batch_id, archive_status=ArchiveStatus.WAITING).update(
            archive_status=ArchiveStatus.FAILED,
            archive_error="The archive could not be queued for building.",
        )
