"""Stream limits per priority, from the device profile or set by hand."""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from synthesis import lanes
from synthesis.engines.device_profiles import A10_COSYVOICE2, T4_COSYVOICE2, DeviceProfile
from synthesis.lanes import NARROW_BRPOP_TIMEOUT_S, AdmittedQueues
from synthesis.stream_limits import LimitsChoice, StreamLimits, worker_stream_limits

ALL = ("synth.high", "synth.normal", "synth.low")


def test_a_t4_runs_five_normal_streams_keeps_low_to_two_and_high_to_memory() -> None:
    limits = StreamLimits.from_profile(T4_COSYVOICE2, first_audio_slowdown=1.5, high_slowdown=1.2)
    assert limits == StreamLimits(low=2, normal=5, high=7)
    # A high stream joining the low ones keeps its first audio within 1.2x.
    assert T4_COSYVOICE2.slowdown(limits.low + 1, first=True) <= 1.2


def _by_jobs_taken(ask: Callable[[AdmittedQueues], Any]) -> dict[int, Any]:
    """What `ask` gets from a T4's lanes (2 low, 5 normal, 7 high streams) with
    0 to 7 jobs taken."""
    limits = StreamLimits(2, 5, 7)
    taken = 0
    by_queue = {"synth.high": limits.high, "synth.normal": limits.normal}
    queues = AdmittedQueues(list(ALL), lambda q: taken < by_queue.get(q, limits.low))
    seen = {}
    for taken in range(8):
        seen[taken] = ask(queues)
    return seen


def test_the_consumer_asks_only_for_the_priorities_still_admitted() -> None:
    seen = _by_jobs_taken(lambda queues: queues.consume(3))
    assert seen[0] == seen[1] == list(ALL)
    assert seen[2] == seen[4] == list(ALL[:2])
    assert seen[5] == seen[6] == ["synth.high"]
    assert seen[7] == []


def test_a_brpop_that_leaves_queues_out_waits_briefly() -> None:
    timeouts = _by_jobs_taken(lambda queues: queues.brpop_timeout(3))
    assert timeouts[0] is None  # every queue asked: the channel's usual second
    assert timeouts[2] == timeouts[5] == NARROW_BRPOP_TIMEOUT_S < 0.1
    assert timeouts[7] is None  # nothing asked: no BRPOP at all


@pytest.mark.parametrize(("text", "limits"), [("4", (4, 4, 4)), ("1, 3,6", (1, 3, 6))])
def test_limits_set_by_hand(text: str, limits: tuple[int, int, int], settings: Any) -> None:
    settings.WORKER_STREAMS = text
    assert worker_stream_limits() == StreamLimits(*limits)


@pytest.mark.parametrize(
    ("queues", "limits"),
    [
        (ALL, (2, 5, 7)),
        (("synth.normal", "synth.low"), (2, 5, 7)),
        (("synth.low",), (5, 5, 5)),
        (("synth.low", "webhooks"), (5, 5, 5)),
    ],
)
def test_a_worker_that_takes_only_low_work_runs_the_normal_count_for_it(
    queues: tuple[str, ...], limits: tuple[int, int, int]
) -> None:
    card = LimitsChoice(StreamLimits(2, 5, 7), "profile", profile_name="t4-cosyvoice2")
    assert card.serving(queues).limits == StreamLimits(*limits)
    by_hand = LimitsChoice(StreamLimits(1, 2, 3), "by hand")
    assert by_hand.serving(("synth.low",)) == by_hand


@pytest.mark.parametrize("text", ["0", "3,2,4", "1,2", "many"])
def test_bad_limits_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"stream limits|expected N|invalid literal"):
        StreamLimits.parse(text)


def test_engines_that_cannot_overlap_calls_get_one_stream_per_model(settings: Any) -> None:
    settings.WORKER_STREAMS = ""
    assert worker_stream_limits("espeak", {}) == StreamLimits(1, 1, 1)


def test_the_synthetic_engine_takes_its_limits_from_its_profile(settings: Any) -> None:
    settings.WORKER_STREAMS = ""
    assert worker_stream_limits("synthetic", {}) == StreamLimits(2, 5, 7)
    # Memory given explicitly bounds the streams.
    small = {"device_memory_bytes": 8 * 10**9, "model_memory_bytes": 4 * 10**9}
    assert worker_stream_limits("synthetic", small) == StreamLimits(1, 2, 2)


@pytest.mark.parametrize(
    ("driver", "says"),
    [
        ("redis", "streams at once: low 2, normal 5, high 7; 5 while a realtime session runs"),
        ("memory", "needs the Redis broker"),
    ],
)
def test_a_gpu_worker_says_at_start_what_its_lanes_admit(
    driver: str, says: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(lanes, "_limits", lambda: StreamLimits(2, 5, 7))
    parent = SimpleNamespace(
        connection=SimpleNamespace(transport=SimpleNamespace(driver_type=driver)),
        task_consumer=SimpleNamespace(queues=[SimpleNamespace(name=name) for name in ALL]),
    )
    with caplog.at_level(logging.INFO, logger="synthesis.lanes"):
        lanes.PriorityLanes(parent).start(parent)
    assert says in caplog.text


def test_while_a_realtime_session_runs_high_work_is_taken_only_up_to_the_normal_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lanes, "_limits", lambda: StreamLimits(2, 5, 7))

    def admitted(taken: int) -> list[str]:
        monkeypatch.setattr(lanes.worker_state, "reserved_requests", set(range(taken)))
        return [queue for queue in ALL if lanes.admitted_by_stream_limits(queue)]

    assert admitted(5) == admitted(6) == ["synth.high"]
    with lanes.realtime_sessions.running():
        assert lanes.realtime_sessions.count() == 1
        assert admitted(4) == ["synth.high", "synth.normal"]
        assert admitted(5) == []  # a sixth stream would leave the session behind real time
    assert lanes.realtime_sessions.count() == 0
    assert admitted(5) == ["synth.high"]


@pytest.mark.parametrize("profile", [T4_COSYVOICE2, A10_COSYVOICE2], ids=lambda p: p.name)
def test_a_shipped_cards_normal_count_of_streams_keeps_up_with_real_time(
    profile: DeviceProfile,
) -> None:
    # What a realtime session relies on (synthesis.lanes): each of `normal`
    # streams makes its audio faster than it plays; one more would not on a T4.
    limits = StreamLimits.from_profile(profile, first_audio_slowdown=1.5, high_slowdown=1.2)
    assert profile.rtf * profile.slowdown(limits.normal, first=False) < 1.0
    if profile is T4_COSYVOICE2:
        assert profile.rtf * profile.slowdown(limits.normal + 1, first=False) > 1.0
