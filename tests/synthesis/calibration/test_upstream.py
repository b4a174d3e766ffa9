"""Calibration on the real upstream CosyVoice2 code, tiny random weights, on the CPU.

Small and bounded: a short text (one streamed chunk and the rest), at most three
streams. The CPU is shared with the rest of the suite, so the curve itself is
not checked, only that measuring it twice gives limits within one stream. With
random weights a call's first chunk takes 0.3 s or, now and then, 3 s (seen on
2 cores): `samples=3` gives level two two rounds (a median, not one draw).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from synthesis.calibration.choose import calibrated_limits
from synthesis.calibration.measure import calibrate
from synthesis.calibration.models import CalibratedProfile, ProfileStatus
from synthesis.engines import build_engine
from synthesis.engines.cosyvoice2 import CosyVoice2Engine
from synthesis.stream_limits import limits_for_profile
from tests.upstream_cosyvoice import tiny_model_dir, upstream_src

SHORT = "Hi."


@pytest.fixture(scope="module")
def engine() -> Iterator[CosyVoice2Engine]:
    built = build_engine(
        "cosyvoice2", {"model_dir": str(tiny_model_dir()), "src_dir": str(upstream_src())}
    )
    assert isinstance(built, CosyVoice2Engine)
    yield built
    built.close()


@pytest.mark.django_db(transaction=True)
def test_a_worker_calibrates_the_real_engine_and_a_second_run_agrees(
    engine: CosyVoice2Engine, settings: Any
) -> None:
    settings.CALIBRATION_MAX_S = 90.0
    settings.CALIBRATION_MAX_STREAMS = 3
    choice = calibrated_limits(engine, worker="alice-host:1", text=SHORT, samples=3)
    assert choice.source == "calibrated"
    row = CalibratedProfile.objects.get(key=choice.profile_key)
    assert row.status == ProfileStatus.READY
    assert row.engine == "cosyvoice2"
    assert row.parts["card"].startswith("cpu ")
    assert row.parts["flags"]["slots"] == 1
    assert row.limits == choice.limits.as_text()
    # The next worker of this card starts from the stored profile, at once.
    assert calibrated_limits(engine, worker="bob-host:2", text=SHORT).source == "stored"

    again = calibrate(engine, name="again", stop_slowdown=1.5, max_streams=3, text=SHORT, samples=3)
    second = limits_for_profile(again.profile())
    first = choice.limits
    assert abs(second.normal - first.normal) <= 1
    assert abs(second.low - first.low) <= 1
    assert abs(second.high - first.high) <= 2  # high is twice normal where memory allows
