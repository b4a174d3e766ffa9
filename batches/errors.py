"""Errors of the batches API, each with a stable code."""

from __future__ import annotations

from chorus.errors import ChorusError


class BatchTooLarge(ChorusError):
    """More items, or more characters in all, than the plan takes in one batch."""

    status = 422
    code = "batch_too_large"


class BatchNotCancellable(ChorusError):
    status = 409
    code = "batch_not_cancellable"
