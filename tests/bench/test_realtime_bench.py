"""`bench/realtime.py` drives realtime sessions over the real stack: uvicorn, a
worker on the synthetic engine (an emulated T4), PostgreSQL and Redis. A quick run
of one level, against this test's database and Redis, prints both tables whole,
with figures that make sense."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import stack_env

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]

CONVERSATION = [
    "sessions",
    "ok",
    "first audio p50",
    "p95",
    "after sentence p50",
    "p95",
    "2nd answer p50",
    "p95",
    "flush->done p50",
    "p95",
    "underruns",
    "underrun s",
    "sessions w/ underrun",
    "audio s/session",
]
BARGE_IN = [
    "sessions",
    "ok",
    "cancel->last frame p50",
    "p95",
    "cancel->done p50",
    "p95",
    "frames after cancel",
    "audio after cancel ms p95",
]


def _row(lines: list[str], header: list[str], sessions: int) -> dict[str, str]:
    """The row for `sessions` of the table under `header`, by column; a `p95`
    column is named after the one before it (`first audio p95`)."""
    at = next(n for n, line in enumerate(lines) if line.split() == " ".join(header).split())
    row = next(line for line in lines[at + 1 :] if line.split()[:1] == [str(sessions)])
    keys: list[str] = []
    for name in header:
        keys.append(keys[-1].removesuffix(" p50") + " p95" if name == "p95" else name)
    values = row.split()
    assert len(values) == len(keys), row
    return dict(zip(keys, values, strict=True))


def test_a_quick_run_prints_both_tables_with_sane_figures(broker: Any, tmp_path: Path) -> None:
    plot = tmp_path / "realtime.png"
    result = subprocess.run(
        [
            sys.executable,
            "bench/realtime.py",
            "--quick",
            "--sessions",
            "2",
            "--timeout",
            "60",
            "--plot",
            str(plot),
        ],
        cwd=ROOT,
        env=stack_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    talk = _row(lines, CONVERSATION, 2)
    # A failed session's error is listed under the tables: shown when one fails.
    assert talk["ok"] == "2/2", result.stdout
    first, first_p95 = float(talk["first audio p50"]), float(talk["first audio p95"])
    # The emulated T4's first chunk alone takes 1.48 s; the whole answer is written in ~1 s.
    assert 1.4 < first <= first_p95 < 30
    assert 0 < float(talk["after sentence p50"]) <= first
    assert 0 < float(talk["2nd answer p50"]) < 30
    assert 0 < float(talk["flush->done p50"]) <= float(talk["flush->done p95"]) < 60
    assert int(talk["underruns"]) >= 0
    assert float(talk["underrun s"]) >= 0
    assert 0 <= int(talk["sessions w/ underrun"]) <= 2
    assert float(talk["audio s/session"]) > 2
    barge = _row(lines, BARGE_IN, 2)
    assert barge["ok"] == "2/2", result.stdout
    last_frame, done = float(barge["cancel->last frame p50"]), float(barge["cancel->done p50"])
    assert 0 <= last_frame <= done < 5000
    assert int(barge["frames after cancel"]) >= 0
    assert plot.read_bytes().startswith(b"\x89PNG")
