from __future__ import annotations

import logging
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import close_old_connections

from chorus.metrics_server import serve_metrics
from synthesis.metrics import live_collectors
from synthesis.services.sweeper import sweep

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Repair stuck jobs, settle orphan reservations and expire old audio, periodically."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--interval", type=float, default=10.0, help="seconds between sweeps")
        parser.add_argument("--once", action="store_true", help="sweep once and exit")

    def handle(self, *args: Any, interval: float, once: bool, **options: Any) -> None:
        if not once:
            # Its host's counts and the line's gauges (queue depth, oldest wait):
            # every deployment runs a sweeper, so autoscaling can rely on them.
            serve_metrics(collectors=live_collectors)
        while True:
            # As around a web request: a connection broken by a database restart,
            # or past its age, is replaced rather than failing every later pass.
            close_old_connections()
            try:
                report = sweep()
                if any(vars(report).values()):
                    log.info("sweep: %s", report)
            except Exception:  # keep sweeping; one bad pass must not stop repairs
                log.exception("sweep failed")
                if once:
                    raise
            if once:
                self.stdout.write(str(report))
                return
            time.sleep(interval)
