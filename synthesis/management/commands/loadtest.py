"""`manage.py loadtest`: the same tool as `chorus-loadtest` (see chorus.loadtest)."""

from __future__ import annotations

from typing import Any, TextIO, cast

from django.core.management.base import BaseCommand, CommandError, CommandParser

from chorus.loadtest import cli
from chorus.loadtest.runner import LoadTestError


class Command(BaseCommand):
    help = cli.DESCRIPTION

    def add_arguments(self, parser: CommandParser) -> None:
        cli.add_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        # The progress line redraws itself with "\r": no added newline, no colour.
        self.stderr.ending = ""
        self.stderr.style_func = None  # type: ignore[assignment]
        try:
            status = cli.run(
                cli.options_from(options),
                stdout=cast(TextIO, self.stdout),
                stderr=cast(TextIO, self.stderr),
            )
        except LoadTestError as exc:
            raise CommandError(str(exc)) from None
        if status:
            raise CommandError("some requests failed (see the failures above)", returncode=status)
