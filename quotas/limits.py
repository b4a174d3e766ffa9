"""Plan limits checked at submit time, each failing with a stable error code."""

from __future__ import annotations

from chorus.errors import PriorityNotAllowed, TextTooLong
from quotas.plans import Limits


def limits_check_text(*, limits: Limits, text: str) -> None:
    limit = limits.max_text_chars
    if len(text) > limit:
        raise TextTooLong(
            f"The text is {len(text)} characters long; your plan allows {limit} per request. "
            "Split it into several requests.",
            details={"limit": limit, "value": len(text)},
        )


def limits_check_priority(*, limits: Limits, priority: str) -> None:
    allowed = list(limits.allowed_priorities)
    if priority not in allowed:
        raise PriorityNotAllowed(
            f"Your plan does not include priority '{priority}'. Allowed: {', '.join(allowed)}.",
            details={"allowed": allowed, "value": priority},
        )
