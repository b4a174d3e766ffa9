"""When a failed delivery is tried again."""

from __future__ import annotations

import random

from django.conf import settings

JITTER = 0.2  # each delay is stretched or shrunk by up to this fraction


def retry_delay_s(*, attempts_made: int, rng: random.Random | None = None) -> float | None:
    """Seconds until the next attempt after `attempts_made` attempts failed, or
    None once the schedule is used up (the delivery has failed for good).

    Jitter spreads the retries of many deliveries that failed together (a
    receiver down for a minute) so they do not all come back at once."""
    schedule: list[float] = settings.WEBHOOK_RETRY_SCHEDULE_S
    if attempts_made < 1 or attempts_made > len(schedule):
        return None
    delay = schedule[attempts_made - 1]
    return delay * (1 + (rng or random).uniform(-JITTER, JITTER))


def max_attempts() -> int:
    return len(settings.WEBHOOK_RETRY_SCHEDULE_S) + 1
