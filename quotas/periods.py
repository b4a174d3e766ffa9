"""Monthly billing periods that start on the tenant's anchor day."""

from __future__ import annotations

import calendar
from datetime import UTC, date, datetime


def _anchored(year: int, month: int, day: int) -> datetime:
    # An anchor on the 31st falls on the last day of shorter months.
    last = calendar.monthrange(year, month)[1]
    return datetime(year, month, min(day, last), tzinfo=UTC)


def _next_month(year: int, month: int) -> tuple[int, int]:
    return (year + 1, 1) if month == 12 else (year, month + 1)


def _previous_month(year: int, month: int) -> tuple[int, int]:
    return (year - 1, 12) if month == 1 else (year, month - 1)


def billing_period(anchor: date, now: datetime) -> tuple[datetime, datetime]:
    """[start, end) of the period containing `now` for a tenant anchored on `anchor`."""
    start = _anchored(now.year, now.month, anchor.day)
    if start > now:
        start = _anchored(*_previous_month(now.year, now.month), anchor.day)
    end = _anchored(*_next_month(start.year, start.month), anchor.day)
    return start, end
