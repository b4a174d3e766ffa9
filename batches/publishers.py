"""The batches app's senders to the broker, registered by `batches.tasks`
(see `synthesis.publishers`): no batch service imports its tasks module."""

from __future__ import annotations

from synthesis.publishers import Publisher

# A batch's archive, once it ended: (batch id).
send_batch_archive: Publisher[[str]] = Publisher("batch archive")
# The end of a cancelled batch, in the background: (batch id).
send_batch_cancel_finish: Publisher[[str]] = Publisher("batch cancel finish")
