"""`bench/gpu_truth.py` calibrates the real upstream CosyVoice2 code as a worker does.

On a GPU it compares upstream's plain path with its vLLM path; here, on the CPU
with the tiny random-weight model, the plain variant runs for real (vLLM needs a
GPU) and the side-by-side table is checked on measured levels."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from synthesis.calibration.measure import Calibration, Level
from synthesis.engines.device_profiles import profile_from_json
from tests.upstream_cosyvoice import tiny_model_dir, upstream_src

ROOT = Path(__file__).resolve().parents[2]


def gpu_truth() -> ModuleType:
    environ, path = dict(os.environ), list(sys.path)
    sys.path.append(str(ROOT / "bench"))
    try:  # the bench sets its defaults as it loads: kept from the rest of the suite
        return importlib.import_module("gpu_truth")
    finally:
        os.environ.clear()
        os.environ.update(environ)
        sys.path[:] = path


def test_it_calibrates_the_real_engine_and_writes_the_profile_a_worker_reads(
    tmp_path: Path,
) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "bench/gpu_truth.py",
            "--model-dir",
            str(tiny_model_dir()),
            "--src",
            str(upstream_src()),
            "--variants",
            "plain",
            "--max-streams",
            "2",
            "--samples",
            "1",
            "--audio-s",
            "0.8",
            "--json",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "plain: stream limits low,normal,high = " in result.stdout
    profile = json.loads((tmp_path / "plain.json").read_text())
    levels = profile["calibration"]["levels"]
    assert [level["streams"] for level in levels] == [1, 2][: len(levels)]
    assert profile_from_json(profile).first_audio_s[0] > 0
    table = result.stdout[result.stdout.index("streams |") :]
    assert table.splitlines()[1].split()[0] == "1"


def _calibration(name: str, totals: list[float]) -> Calibration:
    return Calibration(
        name=name,
        levels=[
            Level(
                streams=n,
                first_audio_s=0.5,
                total_s=total,
                audio_s=4.0,
                first_chunk_audio_s=1.0,
                memory_bytes=n * 2**20,
                slowdown=1.0 + 0.25 * (n - 1),
            )
            for n, total in enumerate(totals, start=1)
        ],
    )


def test_the_table_puts_two_variants_side_by_side_with_the_throughput_gained() -> None:
    plain = _calibration("plain", [2.0, 4.0])  # 2 and 2 audio seconds per second
    batched = _calibration("vllm", [2.0, 2.0, 3.0])  # 2, 4, 4

    table = gpu_truth().curves_table({"plain": plain, "vllm": batched}, "the.")

    lines = table.strip().splitlines()
    assert lines[1].split("|")[-1].strip() == "vllm/plain"
    rows = [line.split("|") for line in lines[2:]]
    assert [row[0].strip() for row in rows] == ["1", "2", "3"]
    assert [row[-1].strip() for row in rows] == ["1.00x", "2.00x", "-"]
    assert rows[1][2].split()[1] == "1.25"  # vllm's first audio over a lone stream's
    assert rows[1][2].split()[3] == "4.00"  # vllm's throughput at two streams


@pytest.fixture(autouse=True)
def _no_leftover_module() -> object:
    yield None
    sys.modules.pop("gpu_truth", None)
    sys.modules.pop("harness", None)
