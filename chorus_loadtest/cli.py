"""Arguments shared by `chorus-loadtest` and `manage.py loadtest`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from chorus_loadtest.options import (
    DEFAULT_REPETITIONS,
    DEFAULT_TEXT,
    LoadTestOptions,
    parse_levels,
    parse_priority_mix,
)
from chorus_loadtest.report import console, write_reports
from chorus_loadtest.runner import LoadTestError, Progress, run_load_test

DESCRIPTION = (
    "Load-test a Chorus deployment over its HTTP API: per concurrency level, latency "
    "percentiles, throughput, failures by error code and worker/GPU resources."
)


def _argument(kind: Any) -> Any:
    """Wrap a parser so argparse reports its ValueError message."""

    def parse(value: str) -> Any:
        try:
            return kind(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=os.environ.get("CHORUS_URL", "http://127.0.0.1:8000"),
        help="base URL of the deployment (env CHORUS_URL; default %(default)s)",
    )
    parser.add_argument(
        "--key",
        default=os.environ.get("CHORUS_API_KEY", ""),
        help="a tenant API key with speech:write (env CHORUS_API_KEY)",
    )
    parser.add_argument(
        "--concurrency",
        type=_argument(parse_levels),
        default=(1, 2, 3, 4, 5),
        help="levels, e.g. 1,2,4,8 or 1-5,10,20,50 (default 1-5)",
    )
    length = parser.add_mutually_exclusive_group()
    length.add_argument(
        "--repetitions",
        "--requests",
        type=int,
        default=DEFAULT_REPETITIONS,
        dest="repetitions",
        help="measured requests per level, shared by its users (default %(default)s)",
    )
    length.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="SECONDS",
        help="run each level this long instead (requests in flight are finished)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="requests before the first level, not counted (default %(default)s)",
    )
    parser.add_argument("--text", default=DEFAULT_TEXT, help="the text of every request")
    parser.add_argument("--voice", default=None, help="a voice id (default: none)")
    parser.add_argument(
        "--priority",
        type=_argument(parse_priority_mix),
        default=("normal",),
        help="a priority or a mix, e.g. high:1,low:3 (default normal)",
    )
    parser.add_argument("--format", default="wav", dest="audio_format", help="output format")
    parser.add_argument(
        "--stream",
        action="store_true",
        help='ask for streamed audio ("stream": true) and time its first byte',
    )
    parser.add_argument(
        "--stream-path", default="/v1/speech", help="route that streams (default %(default)s)"
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=0.05,
        metavar="SECONDS",
        help="job polling interval without --stream (default %(default)s)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="give up on (and cancel) a request after this long (default %(default)s)",
    )
    parser.add_argument(
        "--worker-pid",
        type=int,
        action="append",
        default=[],
        dest="worker_pids",
        help="sample this local process's memory, children included (repeatable)",
    )
    parser.add_argument(
        "--sample-processes",
        action="append",
        default=[],
        metavar="PATTERN",
        help="sample local processes whose command line contains PATTERN, e.g. celery",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        metavar="DIR",
        help="write loadtest.md, loadtest.csv, samples.csv and loadtest.png",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress line")


def options_from(values: dict[str, Any]) -> LoadTestOptions:
    if not values["key"]:
        raise LoadTestError("an API key is needed: --key or CHORUS_API_KEY")
    positive = {
        "--repetitions": values["repetitions"],
        "--poll-interval": values["poll_interval"],
        "--timeout": values["timeout"],
    }
    for name, value in positive.items():
        if value <= 0:
            raise LoadTestError(f"{name} must be positive")
    if values["duration"] is not None and values["duration"] <= 0:
        raise LoadTestError("--duration must be positive")
    if values["warmup"] < 0:
        raise LoadTestError("--warmup must not be negative")
    return LoadTestOptions(
        url=values["url"].rstrip("/"),
        key=values["key"],
        levels=tuple(values["concurrency"]),
        repetitions=values["repetitions"],
        duration_s=values["duration"],
        warmup=values["warmup"],
        text=values["text"],
        voice_id=values["voice"],
        priorities=tuple(values["priority"]),
        audio_format=values["audio_format"],
        stream=values["stream"],
        stream_path=values["stream_path"],
        poll_interval_s=values["poll_interval"],
        timeout_s=values["timeout"],
        worker_pids=tuple(values["worker_pids"]),
        process_patterns=tuple(values["sample_processes"]),
        output=values["output"],
        progress=not values["quiet"],
    )


def run(options: LoadTestOptions, *, stdout: TextIO, stderr: TextIO) -> int:
    """Run, print the summary, write the files; the exit status is 1 if any request failed."""
    result = run_load_test(options, progress=Progress(stderr, enabled=options.progress))
    stdout.write(console(result) + "\n")
    if options.output is not None:
        for path in write_reports(result, options.output):
            stdout.write(f"wrote {path}\n")
    return 1 if any(level.failures for level in result.levels) else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="chorus-loadtest", description=DESCRIPTION)
    add_arguments(parser)
    values = vars(parser.parse_args(argv))
    try:
        return run(options_from(values), stdout=sys.stdout, stderr=sys.stderr)
    except LoadTestError as exc:
        parser.exit(2, f"chorus-loadtest: {exc}\n")
    except KeyboardInterrupt:
        return 130
