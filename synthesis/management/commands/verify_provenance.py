"""manage.py verify_provenance <file> [--sidecar <file.c2pa>]: what
POST /v1/provenance/verify answers, for a file on this host."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from synthesis.api.provenance import verification_answer
from synthesis.provenance import SIDECAR_SUFFIX, verify_audio


class Command(BaseCommand):
    help = "Check a file's C2PA Content Credentials; exit 1 when they do not hold."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path)
        parser.add_argument(
            "--sidecar",
            type=Path,
            default=None,
            help="its sidecar manifest (default: <file>.c2pa, where there is one)",
        )

    def handle(self, *args: Any, file: Path, sidecar: Path | None, **options: Any) -> None:
        if not file.is_file():
            raise CommandError(f"{file}: no such file")
        if sidecar is None and file.with_name(file.name + SIDECAR_SUFFIX).is_file():
            sidecar = file.with_name(file.name + SIDECAR_SUFFIX)
        result = verify_audio(
            data=file.read_bytes(), sidecar=sidecar.read_bytes() if sidecar else None
        )
        self.stdout.write(json.dumps(verification_answer(result), indent=2))
        if not result.valid:
            raise CommandError(
                "the Content Credentials do not hold"
                if result.manifest_present
                else "no Content Credentials found"
            )
