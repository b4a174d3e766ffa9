"""Stored profiles, and one calibration per card at a time.

The first worker of a card (a profile key with no row) inserts a `calibrating`
row naming itself and a deadline, and measures; the others of that card find the
row and wait for `ready`. A row whose owner died (a pid of this host that no
longer runs) or whose deadline passed is taken over with a conditional UPDATE,
so two waiters never both calibrate; a `failed` row is taken over the same way.
Plain rows and conditional writes rather than a held row lock: a calibration
takes minutes, and SQLite has no row locks.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Literal

from django.db import IntegrityError, transaction
from django.utils import timezone

from chorus.processes import process_alive
from synthesis.calibration.identity import ProfileKey
from synthesis.calibration.measure import Calibration
from synthesis.calibration.models import CalibratedProfile, ProfileStatus, WorkerLimits
from synthesis.stream_limits import StreamLimits

log = logging.getLogger(__name__)

Outcome = Literal["stored", "calibrate"]


def device_profile_claim(
    *, key: ProfileKey, owner: str, hold_s: float
) -> tuple[Outcome, CalibratedProfile] | None:
    """One look: ("stored", row) when ready, ("calibrate", row) when `owner` now
    holds it, None while another live owner calibrates."""
    row = CalibratedProfile.objects.filter(key=key.digest).first()
    deadline = timezone.now() + timedelta(seconds=hold_s)
    if row is None:
        try:
            with transaction.atomic():
                row = CalibratedProfile.objects.create(
                    key=key.digest,
                    engine=str(key.parts.get("engine", "")),
                    card=str(key.parts.get("card", ""))[:200],
                    parts=key.parts,
                    status=ProfileStatus.CALIBRATING,
                    owner=owner,
                    deadline=deadline,
                )
        except IntegrityError:
            return None  # another worker inserted it first: look again
        return "calibrate", row
    if row.status == ProfileStatus.READY:
        return "stored", row
    if row.status == ProfileStatus.CALIBRATING and not _abandoned(row):
        return None
    taken = CalibratedProfile.objects.filter(
        key=row.key, status=row.status, owner=row.owner, deadline=row.deadline
    ).update(status=ProfileStatus.CALIBRATING, owner=owner, deadline=deadline, error="")
    if not taken:
        return None  # another waiter took it over first
    log.warning("calibration of %s: taking over from %s", key.short, row.owner or "nobody")
    row.refresh_from_db()
    return "calibrate", row


def device_profile_wait_or_claim(
    *,
    key: ProfileKey,
    owner: str,
    hold_s: float,
    poll_s: float = 1.0,
    progress: Callable[[str], None] = log.info,
) -> tuple[Outcome, CalibratedProfile]:
    """Claim the calibration of `key`, or wait while another worker holds it."""
    said_at = 0.0
    while True:
        claimed = device_profile_claim(key=key, owner=owner, hold_s=hold_s)
        if claimed is not None:
            return claimed
        if time.monotonic() - said_at >= 10.0:
            row = CalibratedProfile.objects.filter(key=key.digest).first()
            holder = row.owner if row is not None else "?"
            progress(f"waiting for {holder} to calibrate {key.short}")
            said_at = time.monotonic()
        time.sleep(poll_s)


def device_profile_save(
    *, key: ProfileKey, owner: str, calibration: Calibration, limits: StreamLimits
) -> CalibratedProfile:
    """Store a finished calibration as the card's profile (ready for every worker)."""
    values = {
        "engine": str(key.parts.get("engine", "")),
        "card": str(key.parts.get("card", ""))[:200],
        "parts": key.parts,
        "status": ProfileStatus.READY,
        "owner": owner,
        "deadline": None,
        "document": calibration.profile_json(),
        "limits": limits.as_text(),
        "error": "",
        "calibrated_at": timezone.now(),
    }
    row, _ = CalibratedProfile.objects.update_or_create(key=key.digest, defaults=values)
    return row


def device_profile_fail(*, key: ProfileKey, owner: str, error: str) -> None:
    """Give the row up: the next worker of this card calibrates again."""
    CalibratedProfile.objects.filter(
        key=key.digest, owner=owner, status=ProfileStatus.CALIBRATING
    ).update(status=ProfileStatus.FAILED, deadline=None, error=error[:2000])


def worker_limits_record(
    *,
    worker: str,
    limits: StreamLimits,
    source: str,
    profile_name: str = "",
    profile_key: str | None = None,
) -> WorkerLimits:
    row, _ = WorkerLimits.objects.update_or_create(
        worker=worker,
        defaults={
            "low": limits.low,
            "normal": limits.normal,
            "high": limits.high,
            "source": source,
            "profile_name": profile_name[:200],
            "profile_id": profile_key,
        },
    )
    return row


def _abandoned(row: CalibratedProfile) -> bool:
    if row.deadline is not None and row.deadline <= timezone.now():
        return True
    host, _, pid = row.owner.rpartition(":")
    # A pid is judged only on its own host; elsewhere the deadline decides.
    return host == socket.gethostname() and pid.isdigit() and not process_alive(int(pid))
