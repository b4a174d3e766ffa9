"""`manage.py calibrate_device`: measure this card with the configured engine and
store its profile, replacing any stored for the same key (docs/calibration.md)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from synthesis.calibration.identity import profile_key
from synthesis.calibration.measure import TEXT, calibrate
from synthesis.calibration.services import device_profile_save
from synthesis.engines import build_engine
from synthesis.stream_limits import limits_for_profile


class Command(BaseCommand):
    help = "Measure this card at 1, 2, 3, ... streams and store its device profile."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--max-seconds", type=float, default=settings.CALIBRATION_MAX_S)
        parser.add_argument("--max-streams", type=int, default=settings.CALIBRATION_MAX_STREAMS)
        parser.add_argument("--samples", type=int, default=4, help="streams measured per level")
        parser.add_argument("--text", default=TEXT)
        parser.add_argument("--json", type=Path, help="also write the profile to this file")
        parser.add_argument("--dry-run", action="store_true", help="measure, store nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        engine = build_engine(settings.ENGINE, settings.ENGINE_OPTIONS)
        key = profile_key(engine)
        self.stdout.write(f"calibrating {key.short} ({json.dumps(key.parts, sort_keys=True)})")
        engine.load()
        try:
            calibration = calibrate(
                engine,
                name=f"calibrated-{key.digest[:12]}",
                stop_slowdown=max(
                    settings.FIRST_AUDIO_SLOWDOWN, settings.HIGH_FIRST_AUDIO_SLOWDOWN
                ),
                max_streams=options["max_streams"],
                max_seconds=options["max_seconds"],
                samples=options["samples"],
                text=options["text"],
                progress=self.stdout.write,
            )
        finally:
            engine.close()
        limits = limits_for_profile(calibration.profile())
        document = calibration.profile_json()
        if options["json"]:
            options["json"].write_text(json.dumps(document, indent=2) + "\n")
        if not options["dry_run"]:
            device_profile_save(
                key=key,
                owner=f"{socket.gethostname()}:{os.getpid()}",
                calibration=calibration,
                limits=limits,
            )
        self.stdout.write(
            f"stream limits low,normal,high = {limits.as_text()} "
            f"({calibration.stopped_because}; {calibration.seconds:.0f} s)"
            + ("" if options["dry_run"] else f"; stored as {key.digest}")
        )
