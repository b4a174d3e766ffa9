"""Latency and failure rate against concurrency, as a PNG."""

from __future__ import annotations

from pathlib import Path

from chorus.loadtest.runner import RunResult


def write_plot(result: RunResult, path: Path) -> None:
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

    failures.bar(users, [lv.failure_rate * 100 for lv in levels], color="tab:red", width=0.6)
    failures.set_ylabel("failed %")
    failures.set_ylim(0, 100)
    failures.set_xlabel("concurrent users")
    failures.set_xticks(users)
    failures.grid(True, axis="y", alpha=0.3)

    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
