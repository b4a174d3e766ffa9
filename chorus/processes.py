"""Is a process on this machine still alive? Judged in this pid namespace."""

from __future__ import annotations

import os
from pathlib import Path


def proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, start time) from /proc, or None where /proc is unavailable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces; everything after its ")" is fixed.
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0], fields[19]


def process_alive(pid: int, *, started: str | None = None) -> bool:
    """True while `pid` runs (a zombie has exited); with `started`, only if it is
    still the process that started then (not a recycled pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    stat = proc_stat(pid)
    if stat is None:
        return True
    state, start = stat
    if state in ("Z", "X"):
        return False  # exited, not yet reaped by its parent
    return started in (None, start)
