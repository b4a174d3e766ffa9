from __future__ import annotations

import csv
import io
from pathlib import Path

from chorus_loadtest.plot import draw
from chorus_loadtest.report import console, markdown, write_reports
from tests.loadtest.recorded import recorded_result

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _rows(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


def test_it_writes_markdown_csv_and_a_png(tmp_path: Path) -> None:
    paths = write_reports(recorded_result(), tmp_path / "out")
    assert [p.name for p in paths] == ["loadtest.md", "loadtest.csv", "samples.csv", "loadtest.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    assert paths[3].read_bytes().startswith(PNG_SIGNATURE)


def test_the_level_csv_has_a_row_per_level_with_its_figures(tmp_path: Path) -> None:
    write_reports(recorded_result(), tmp_path)
    one, two = _rows(tmp_path / "loadtest.csv")
    assert (one["concurrency"], one["requests"], one["failures"]) == ("1", "5", "0")
    assert one["first_audio_p95_s"] == "1.780"
    assert one["jobs_per_s"] == "0.500"
    assert one["growth_total_mean"] == "0.0000"
    assert one["worker_rss_peak_mib"] == "200.0"
    assert one["gpu_memory_peak_mib"] == ""
    assert (two["concurrency"], two["succeeded"], two["failure_rate"]) == ("2", "3", "0.4000")
    assert two["failures_by_code"] == "engine_error=1;rate_limited=1"
    assert two["total_mean_s"] == "3.500"
    assert two["audio_s_per_s"] == "1.800"
    assert two["growth_first_audio_mean"] == "0.5625"
    assert two["growth_jobs_per_s"] == "-0.2500"


def test_the_sample_csv_has_a_row_per_request(tmp_path: Path) -> None:
    write_reports(recorded_result(), tmp_path)
    rows = _rows(tmp_path / "samples.csv")
    assert len(rows) == 10
    assert [r["concurrency"] for r in rows] == ["1"] * 5 + ["2"] * 5
    limited = rows[-1]
    assert (limited["ok"], limited["error_code"], limited["http_status"]) == (
        "False",
        "rate_limited",
        "429",
    )
    assert rows[0]["started_s"] == "0.000"
    assert rows[0]["engine"] == "synthetic"


def test_the_markdown_table_has_a_row_per_level_and_names_the_engine() -> None:
    text = markdown(recorded_result())
    assert "Engine reported by the jobs: synthetic" in text
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert len(table) == 4  # header, rule, two levels
    one = [cell.strip() for cell in table[2].strip("|").split("|")]
    two = [cell.strip() for cell in table[3].strip("|").split("|")]
    assert one[:6] == ["1", "5", "0 (0 %)", "1.60", "1.60 / 1.78 / 1.80", "+0 %"]
    assert two[:3] == ["2", "5", "2 (40 %): engine_error 1, rate_limited 1"]
    assert two[5] == "+56 %"  # first audio mean, 2.5 s against 1.6 s
    assert two[8] == "+75 %"  # total mean, 3.5 s against 2.0 s
    assert two[11] == "-25 %"  # jobs per second
    assert two[12] == "300 MiB"


def test_the_console_summary_shows_each_figure_with_its_growth() -> None:
    text = console(recorded_result())
    assert "concurrency 2: 5 requests, 2 failed (40.0 %)" in text
    assert "failures     engine_error 1, rate_limited 1" in text
    assert "mean 2.500 s (+56 %)" in text
    assert "0.375 jobs/s (-25 %)" in text


def test_the_failure_panel_says_0_failures_where_a_level_had_none() -> None:
    figure = draw(recorded_result())
    _, failures = figure.axes

    labels = [text.get_text() for text in failures.texts]
    assert labels == ["0 failures", "2 failed (40%)"]
    # The 0 % level is drawn: a line along the axis, not an empty panel.
    [zero] = failures.lines
    assert list(zero.get_ydata()) == [0, 0]
    assert zero.get_linewidth() >= 2
