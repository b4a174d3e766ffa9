"""A run's results as console text, a Markdown table and CSV files."""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

from chorus_loadtest.runner import RunResult
from chorus_loadtest.sampler import MiB, ResourceSummary
from chorus_loadtest.stats import GROWTH_METRICS, LevelStats, base_level, growths

NONE = "-"  # an empty cell in the tables
LEVEL_FIELDS = [
    "concurrency",
    "requests",
    "succeeded",
    "failures",
    "failure_rate",
    "failures_by_code",
    "wall_s",
    "first_audio_mean_s",
    "first_audio_p50_s",
    "first_audio_p95_s",
    "first_audio_p99_s",
    "total_mean_s",
    "total_p50_s",
    "total_p95_s",
    "jobs_per_s",
    "audio_s_per_s",
    *(f"growth_{m}" for m in GROWTH_METRICS),
    "worker_rss_peak_mib",
    "gpu_memory_peak_mib",
    "gpu_util_mean_pct",
    "gpu_util_peak_pct",
    "streamed",
]
SAMPLE_FIELDS = [
    "concurrency",
    "index",
    "priority",
    "ok",
    "error_code",
    "http_status",
    "started_s",
    "submit_s",
    "first_audio_s",
    "total_s",
    "audio_s",
    "streamed",
    "job_id",
    "engine",
]


def _num(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return NONE if value is None else f"{value * 100:+.0f} %"


def _mib(value: int | None) -> str:
    return NONE if value is None else f"{value / MiB:.0f} MiB"


def _codes(level: LevelStats) -> str:
    return ", ".join(f"{code} {n}" for code, n in level.failures_by_code.items())


def level_rows(result: RunResult) -> list[dict[str, object]]:
    base = base_level(result.levels)
    rows = []
    for level in result.levels:
        res = level.resources or ResourceSummary()
        grown = growths(level, base)
        rows.append(
            {
                "concurrency": level.concurrency,
                "requests": level.requests,
                "succeeded": level.succeeded,
                "failures": level.failures,
                "failure_rate": _num(level.failure_rate, 4),
                "failures_by_code": ";".join(f"{c}={n}" for c, n in level.failures_by_code.items()),
                "wall_s": _num(level.wall_s),
                "first_audio_mean_s": _num(level.first_audio_mean),
                "first_audio_p50_s": _num(level.first_audio_p50),
                "first_audio_p95_s": _num(level.first_audio_p95),
                "first_audio_p99_s": _num(level.first_audio_p99),
                "total_mean_s": _num(level.total_mean),
                "total_p50_s": _num(level.total_p50),
                "total_p95_s": _num(level.total_p95),
                "jobs_per_s": _num(level.jobs_per_s),
                "audio_s_per_s": _num(level.audio_s_per_s),
                **{f"growth_{m}": _num(g, 4) for m, g in grown.items()},
                "worker_rss_peak_mib": _num(_over(res.rss_peak_bytes, MiB), 1),
                "gpu_memory_peak_mib": _num(_over(res.gpu_memory_peak_bytes, MiB), 1),
                "gpu_util_mean_pct": _num(res.gpu_util_mean_pct, 1),
                "gpu_util_peak_pct": _num(res.gpu_util_peak_pct, 1),
                "streamed": level.streamed,
            }
        )
    return rows


def _over(value: int | None, unit: int) -> float | None:
    return None if value is None else value / unit


def write_csv(path: Path, fields: list[str], rows: Iterable[dict[str, object]]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def sample_rows(result: RunResult) -> list[dict[str, object]]:
    origin = min((s.started for s in result.samples), default=0.0)
    return [
        {
            "concurrency": s.level,
            "index": s.index,
            "priority": s.priority,
            "ok": s.ok,
            "error_code": s.error_code,
            "http_status": s.http_status if s.http_status is not None else "",
            "started_s": _num(s.started - origin),
            "submit_s": _num(s.submit_s),
            "first_audio_s": _num(s.first_audio_s),
            "total_s": _num(s.total_s),
            "audio_s": _num(s.audio_s),
            "streamed": s.streamed,
            "job_id": s.job_id,
            "engine": s.engine,
        }
        for s in result.samples
    ]


def describe(result: RunResult) -> list[str]:
    """The run's settings, as the lines a reader needs to reproduce it."""
    o = result.options
    length = (
        f"{o.duration_s:g} s per level"
        if o.duration_s is not None
        else f"{o.repetitions} per level"
    )
    mode = (
        f"streamed from {o.stream_path}"
        if o.stream
        else f"polled every {o.poll_interval_s * 1000:.0f} ms"
    )
    mix = ", ".join(f"{p} {o.priorities.count(p)}" for p in dict.fromkeys(o.priorities))
    return [
        f"Target: {o.url}; started {result.started_at:%Y-%m-%d %H:%M:%S} UTC; "
        f"took {result.wall_s:.1f} s",
        f"Engine reported by the jobs: {', '.join(result.engines) or 'unknown'}",
        f"Concurrency levels: {', '.join(map(str, o.levels))}; requests: {length}; "
        f"warm-up: {o.warmup} (not counted)",
        f"Text: {len(o.text)} characters; voice: {o.voice_id or 'none (engine default)'}; "
        f"format: {o.audio_format}; priority mix: {mix}",
        f"Jobs {mode}",
    ]


def markdown(result: RunResult) -> str:
    base = base_level(result.levels)
    basis = f"{base.concurrency} user{'s' if base.concurrency > 1 else ''}" if base else NONE
    lines = ["# Chorus load test", ""]
    lines += [f"- {line}" for line in describe(result) + result.notes]
    lines += [
        "",
        f"| Users | Requests | Failed | First audio mean (s) | First audio p50 / p95 / p99 (s) "
        f"| vs {basis} | Total mean (s) | Total p50 / p95 (s) | vs {basis} | Jobs/s "
        f"| Audio s/s | vs {basis} | Worker RSS peak | GPU memory peak | GPU util mean |",
        "|" + " --- |" * 15,
    ]
    for level in result.levels:
        grown = growths(level, base)
        res = level.resources or ResourceSummary()
        failed = f"{level.failures} ({level.failure_rate * 100:.0f} %)"
        if level.failures:
            failed += f": {_codes(level)}"
        util = NONE if res.gpu_util_mean_pct is None else f"{res.gpu_util_mean_pct:.0f} %"
        cells = [
            str(level.concurrency),
            str(level.requests),
            failed,
            _num(level.first_audio_mean, 2) or NONE,
            " / ".join(
                _num(v, 2) or NONE
                for v in (level.first_audio_p50, level.first_audio_p95, level.first_audio_p99)
            ),
            _pct(grown["first_audio_mean"]),
            _num(level.total_mean, 2) or NONE,
            " / ".join(_num(v, 2) or NONE for v in (level.total_p50, level.total_p95)),
            _pct(grown["total_mean"]),
            _num(level.jobs_per_s, 2) or NONE,
            _num(level.audio_s_per_s, 2) or NONE,
            _pct(grown["jobs_per_s"]),
            _mib(res.rss_peak_bytes),
            _mib(res.gpu_memory_peak_bytes),
            util,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Growth (vs) is relative to the {basis} level. First audio: "
        + (
            "time to the first byte of the streamed audio."
            if result.options.stream
            else "the server's queued → first audio span plus the client's submit round trip."
        )
        + " Total: client submit → the job seen succeeded. Throughput: succeeded jobs "
        "(and seconds of audio) per second of the level's wall time.",
        "",
    ]
    return "\n".join(lines)


def console(result: RunResult) -> str:
    base = base_level(result.levels)
    lines = [*describe(result), *result.notes, ""]
    for level in result.levels:
        g = growths(level, base)
        lines.append(
            f"concurrency {level.concurrency}: {level.requests} requests, "
            f"{level.failures} failed ({level.failure_rate * 100:.1f} %) in {level.wall_s:.1f} s"
        )
        if level.failures:
            lines.append(f"  failures     {_codes(level)}")
        lines.append(
            "  first audio  "
            + "  ".join(
                f"{name} {_num(getattr(level, f'first_audio_{name}')) or NONE} s "
                f"({_pct(g[f'first_audio_{name}'])})"
                for name in ("p50", "p95", "p99", "mean")
            )
        )
        lines.append(
            "  total        "
            + "  ".join(
                f"{name} {_num(getattr(level, f'total_{name}')) or NONE} s "
                f"({_pct(g[f'total_{name}'])})"
                for name in ("p50", "p95", "mean")
            )
        )
        lines.append(
            f"  throughput   {_num(level.jobs_per_s) or NONE} jobs/s ({_pct(g['jobs_per_s'])})  "
            f"{_num(level.audio_s_per_s) or NONE} audio s/s ({_pct(g['audio_s_per_s'])})"
        )
        res = level.resources
        if res and (res.rss_peak_bytes is not None or res.gpu_memory_peak_bytes is not None):
            util = NONE if res.gpu_util_mean_pct is None else f"{res.gpu_util_mean_pct:.0f} %"
            lines.append(
                f"  resources    worker RSS peak {_mib(res.rss_peak_bytes)}, GPU memory peak "
                f"{_mib(res.gpu_memory_peak_bytes)}, GPU util mean {util}"
            )
    lines.append(
        f"(growth in brackets is relative to the one-user level; {len(result.samples)} "
        "measured requests)"
    )
    return "\n".join(lines)


def write_reports(result: RunResult, directory: Path) -> list[Path]:
    """Write loadtest.md, loadtest.csv, samples.csv and loadtest.png into `directory`."""
    from chorus_loadtest.plot import write_plot

    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / n for n in ("loadtest.md", "loadtest.csv", "samples.csv", "loadtest.png")]
    paths[0].write_text(markdown(result))
    write_csv(paths[1], LEVEL_FIELDS, level_rows(result))
    write_csv(paths[2], SAMPLE_FIELDS, sample_rows(result))
    write_plot(result, paths[3])
    return paths
