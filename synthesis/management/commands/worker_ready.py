"""Is a worker on this host ready to take jobs? For compose's healthcheck.

Ready means: a worker process of this host that is still running has a fresh
heartbeat row (written only once its engine loaded and warmed up, so the row
is the engine's "loaded"), is not draining (stopping after a SIGTERM: it takes
no new jobs, `synthesis.drain`), and the broker answers. Exit status 0 when
ready, 1 with the reason otherwise.
"""

from __future__ import annotations

import socket
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from chorus.health import check_broker
from chorus.processes import process_alive
from synthesis.heartbeat import worker_is_alive
from synthesis.models import WorkerHeartbeat


def local_live_workers(host: str) -> list[WorkerHeartbeat]:
    """This host's live workers whose engine is loaded, draining or not."""
    now = timezone.now()
    live = []
    for beat in WorkerHeartbeat.objects.filter(name__startswith=f"{host}:"):
        pid = beat.name.rpartition(":")[2]
        # A failed start leaves a row with device "-" (`report_failed_start`).
        if beat.device == "-" or not pid.isdigit() or not process_alive(int(pid)):
            continue
        if worker_is_alive(beat.seen_at, now):
            live.append(beat)
    return live


class Command(BaseCommand):
    help = (
        "Exit 0 when a worker on this host has its engine loaded, beats and is not "
        "draining; 1 otherwise."
    )
    # Run every few seconds by compose: no system checks (they import the URLs).
    requires_system_checks: list[str] = []

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            live = local_live_workers(socket.gethostname())
        except Exception as exc:
            raise CommandError(f"database unreachable: {type(exc).__name__}") from None
        beat = next((b for b in live if b.draining_since is None), None)
        if beat is None and live:
            since = min(b.draining_since for b in live if b.draining_since is not None)
            raise CommandError(
                f"draining since {since.isoformat(timespec='seconds')}: "
                f"{live[0].name} is stopping and takes no new jobs"
            )
        if beat is None:
            raise CommandError("no live worker with a loaded engine on this host")
        try:
            check_broker()
        except Exception as exc:
            raise CommandError(f"broker unreachable: {type(exc).__name__}") from None
        self.stdout.write(f"ready: {beat.name} ({beat.engine} on {beat.device})")
