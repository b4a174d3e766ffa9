"""One calibration per card: the first worker measures, the others wait for it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from synthesis.calibration.choose import calibrated_limits
from synthesis.calibration.identity import ProfileKey, profile_key
from synthesis.calibration.models import CalibratedProfile, ProfileStatus
from synthesis.calibration.services import device_profile_claim, device_profile_fail
from synthesis.engines.synthetic import SyntheticEngine
from synthesis.stream_limits import StreamLimits, limits_without_engine

HOST = socket.gethostname()
ALICE = f"{HOST}:{os.getpid()}"  # a live worker of this host
KEY = ProfileKey(digest="a" * 64, parts={"engine": "synthetic", "card": "emulated t4"})

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.embedded]


def dead_worker() -> str:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return f"{HOST}:{child.pid}"


def test_the_first_worker_of_a_card_calibrates_and_the_next_waits() -> None:
    assert device_profile_claim(key=KEY, owner=ALICE, hold_s=60)[0] == "calibrate"  # type: ignore[index]
    assert device_profile_claim(key=KEY, owner="other-host:1", hold_s=60) is None


def test_a_calibration_whose_owner_died_is_taken_over_at_once() -> None:
    device_profile_claim(key=KEY, owner=dead_worker(), hold_s=600)
    outcome, row = device_profile_claim(key=KEY, owner=ALICE, hold_s=60)  # type: ignore[misc]
    assert (outcome, row.owner) == ("calibrate", ALICE)


def test_a_calibration_past_its_deadline_is_taken_over_by_one_waiter_only() -> None:
    device_profile_claim(key=KEY, owner="bob-host:7", hold_s=60)
    CalibratedProfile.objects.update(deadline=timezone.now() - timedelta(seconds=1))
    first = device_profile_claim(key=KEY, owner=ALICE, hold_s=60)
    second = device_profile_claim(key=KEY, owner="carol-host:9", hold_s=60)
    assert first is not None
    assert first[0] == "calibrate"
    assert second is None


def test_a_failed_calibration_is_tried_again_by_the_next_worker() -> None:
    device_profile_claim(key=KEY, owner=ALICE, hold_s=60)
    device_profile_fail(key=KEY, owner=ALICE, error="boom")
    assert CalibratedProfile.objects.get().status == ProfileStatus.FAILED
    claimed = device_profile_claim(key=KEY, owner="bob-host:7", hold_s=60)
    assert claimed is not None
    assert claimed[0] == "calibrate"


def synthetic(tmp_path: Path) -> SyntheticEngine:
    return SyntheticEngine(time_scale=0.1, state_dir=tmp_path, device="svc", calibrate=True)


def test_workers_of_one_card_measure_it_once_and_start_with_its_limits(
    tmp_path: Path, settings: Any
) -> None:
    settings.CALIBRATION_MAX_S = 60.0
    alice, bob = synthetic(tmp_path), synthetic(tmp_path)
    chosen: dict[str, Any] = {}

    def start(name: str, engine: SyntheticEngine) -> None:
        chosen[name] = calibrated_limits(engine, worker=name)

    threads = [
        threading.Thread(target=start, args=(ALICE, alice)),
        threading.Thread(target=start, args=(f"{HOST}:{os.getppid()}", bob)),
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        alice.close()
        bob.close()
    sources = sorted(choice.source for choice in chosen.values())
    assert sources == ["calibrated", "stored"]
    # The same limits for both (their values are test_measure's concern: this
    # device runs at a tenth of real time, too fast to measure them closely here).
    (found,) = {choice.limits for choice in chosen.values()}
    row = CalibratedProfile.objects.get()
    assert row.status == ProfileStatus.READY
    assert row.limits == found.as_text()
    assert row.key == profile_key(alice).digest
    # A third worker of the card starts at once from the stored profile.
    carol = synthetic(tmp_path)
    assert calibrated_limits(carol, worker="carol-host:3").source == "stored"


def test_auto_on_engines_that_need_no_measuring_is_immediate(settings: Any) -> None:
    settings.DEVICE_PROFILE = "auto"
    settings.WORKER_STREAMS = ""
    espeak = limits_without_engine("espeak", {})
    assert espeak is not None
    assert (espeak.limits, espeak.source) == (
        StreamLimits(1, 1, 1),
        "engine",
    )
    emulated = limits_without_engine("synthetic", {})
    assert emulated is not None
    assert emulated.limits == StreamLimits(2, 5, 7)
    assert emulated.source == "profile"
    assert limits_without_engine("cosyvoice2", {}) is None  # its card is measured
    settings.DEVICE_PROFILE = "t4-cosyvoice2"  # an explicit name still works
    named = limits_without_engine("cosyvoice2", {})
    assert named is not None
    assert named.limits == StreamLimits(2, 5, 7)


def test_metrics_say_each_workers_limits_and_where_they_came_from() -> None:
    from synthesis.calibration.services import worker_limits_record
    from synthesis.engines.base import EngineInfo
    from synthesis.heartbeat import Heartbeat
    from synthesis.metrics import DatabaseCollector

    info = EngineInfo(name="cosyvoice2", sample_rate=24000, device="cuda:0", memory_bytes=0)
    Heartbeat(name=ALICE, info=info, slots=7).beat()
    worker_limits_record(
        worker=ALICE, limits=StreamLimits(2, 5, 7), source="stored", profile_name="calibrated-ab"
    )
    (family,) = [f for f in DatabaseCollector().collect() if f.name == "chorus_worker_stream_limit"]
    assert {(s.labels["priority"], s.labels["source"], s.value) for s in family.samples} == {
        ("low", "stored", 2),
        ("normal", "stored", 5),
        ("high", "stored", 7),
    }
