"""`manage.py job_lifecycle`: a speech job's state diagram, drawn from
`synthesis.job_lifecycle.TRANSITIONS`; `--write` keeps docs/job-lifecycle.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from synthesis.job_lifecycle import LIFECYCLE_DOC, lifecycle_doc


class Command(BaseCommand):
    help = "Print a speech job's lifecycle (Mermaid), or write it to docs/job-lifecycle.md."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--write", action="store_true", help=f"write {LIFECYCLE_DOC}")

    def handle(self, *args: Any, write: bool = False, **options: Any) -> None:
        if not write:
            self.stdout.write(lifecycle_doc(), ending="")
            return
        path = Path(settings.BASE_DIR) / LIFECYCLE_DOC
        path.write_text(lifecycle_doc())
        self.stdout.write(f"wrote {path}")
