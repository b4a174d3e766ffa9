"""Signals of the batches app."""

from django.dispatch import Signal

# A batch ended: every item finished (completed, completed_with_failures) or it was
# cancelled. Sent once per batch, after the transaction that ended it committed.
# Arguments: batch (a Batch), status (its final status). Its archive is built
# after this, on a light worker: the manifest's `archive.status` says when.
batch_completed = Signal()
