"""How the admin writes sizes and spans of time for people."""

from __future__ import annotations

from datetime import datetime

UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(n: int) -> str:
    """`54757398` as "52.2 MiB", `21474836480` as "20 GiB" (powers of 1,024, as
    the limits are set)."""
    if n < 1024:
        return f"{n} bytes"
    value = float(n)
    for unit in UNITS:
        value /= 1024
        if value < 1024 or unit == UNITS[-1]:
            break
    return f"{value:.1f}".removesuffix(".0") + f" {unit}"


def span_seconds(start: datetime | None, end: datetime | None) -> str:
    """The seconds between two stamps, to the millisecond, or "-" before the second.
    Never below zero: a submit is stamped by a web host's clock, the rest by the
    database's (`chorus.db_clock`)."""
    if start is None or end is None:
        return "-"
    return f"{max(0.0, (end - start).total_seconds()):.3f} s"
