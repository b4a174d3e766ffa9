"""Quota and limit errors: stable codes, the limit and the current value in details."""

from __future__ import annotations

from chorus.errors import ChorusError


class QuotaExceeded(ChorusError):
    status = 429
    code = "quota_exceeded"


class TooManyConcurrentJobs(ChorusError):
    status = 429
    code = "too_many_concurrent_jobs"


class RateLimited(ChorusError):
    status = 429
    code = "rate_limited"


class VoiceSlotsFull(ChorusError):
    status = 409
    code = "voice_slots_full"


class StorageQuotaExceeded(ChorusError):
    status = 409
    code = "storage_quota_exceeded"


class InsufficientScope(ChorusError):
    status = 403
    code = "insufficient_scope"
