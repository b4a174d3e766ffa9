"""Signals other apps attach to; sent by `synthesis.job_events`."""

from django.dispatch import Signal

# A job reached its final state (succeeded, failed or cancelled). Sent once per
# job, by the one path that finished it, possibly inside its transaction:
# receivers that read other rows should wait for `transaction.on_commit`.
# Arguments: job (a Job, possibly with only some fields loaded), status.
job_finished = Signal()

# The sweeper finished a pass (`synthesis.services.sweeper.sweep`): apps with
# repair work of their own (batches, webhooks) do it then; `report` (a
# SweepReport) has fields for what they count.
sweep_finished = Signal()
