"""Latency and failure rate against concurrency, as a PNG."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from chorus_loadtest.runner import RunResult
from chorus_loadtest.stats import LevelStats

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def failure_label(level: LevelStats) -> str:
    """What the failure panel writes above a level's bar. A bar of 0 % draws
    nothing, which reads as missing data: the label says there were none."""
    if not level.failures:
        return "0 failures"
    return f"{level.failures} failed ({level.failure_rate:.0%})"


def draw(result: RunResult) -> Figure:
    # Imported here: matplotlib is slow to import and only the file output needs it.
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    levels = result.levels
    users = [lv.concurrency for lv in levels]

    def series(name: str) -> list[float]:
        values = [getattr(lv, name) for lv in levels]
        return [float("nan") if v is None else v for v in values]

    figure, (latency, failures) = plt.subplots(
        2, 1, figsize=(8, 6.5), sharex=True, height_ratios=(3, 1)
    )
    latency.plot(users, series("first_audio_mean"), "o-", label="first audio, mean")
    latency.plot(users, series("first_audio_p95"), "o--", label="first audio, p95")
    latency.plot(users, series("total_mean"), "s-", label="total, mean")
    latency.plot(users, series("total_p95"), "s--", label="total, p95")
    latency.set_ylabel("seconds")
    latency.set_ylim(bottom=0)
    latency.grid(True, alpha=0.3)
    latency.legend(loc="upper left")
    engines = ", ".join(result.engines) or "unknown engine"
    latency.set_title(f"Chorus load test ({engines}) — {result.options.url}", fontsize=10)

    rates = [lv.failure_rate * 100 for lv in levels]
    failures.bar(users, rates, color="tab:red", width=0.6)
    # A measured 0 %: a visible line on the axis and a label, not an empty panel.
    failures.axhline(0, color="tab:red", linewidth=2)
    for level, rate in zip(levels, rates, strict=True):
        failures.annotate(
            failure_label(level),
            (level.concurrency, min(rate, 70)),
            xytext=(0, 4),
            textcoords="offset points",
            ha="center",
            fontsize=8,
        )
    failures.set_ylabel("failed %")
    failures.set_ylim(0, 100)
    failures.set_xlabel("concurrent users")
    failures.set_xticks(users)
    failures.grid(True, axis="y", alpha=0.3)

    figure.tight_layout()
    return figure


def write_plot(result: RunResult, path: Path) -> None:
    import matplotlib.pyplot as plt

    figure = draw(result)
    figure.savefig(path, dpi=110)
    plt.close(figure)
