"""`manage.py loadtest`: the same tool as `chorus-loadtest` (see chorus_loadtest)."""

from __future__ import annotations

from typing import Any, TextIO, cast

from django.core.management.base import BaseCommand, CommandError, CommandParser

try:
    from chorus_loadtest import cli
    from chorus_loadtest.runner import LoadTestError
except ModuleNotFoundError as exc:
    # Web and worker images leave the load test's dependencies out; say how to get them
    # rather than show a traceback.
    MISSING: str | None = exc.name
else:
    MISSING = None


class Command(BaseCommand):
    help = cli.DESCRIPTION if MISSING is None else "Load-test a deployment (chorus[loadtest])."

    def add_arguments(self, parser: CommandParser) -> None:
        if MISSING is not None:
            parser.error(
                f"the load test needs its extra ({MISSING} is not installed): "
                "pip install 'chorus[loadtest]'"
            )
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
