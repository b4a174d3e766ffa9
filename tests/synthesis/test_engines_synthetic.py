"""SyntheticEngine: deterministic output, and one emulated GPU shared across processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chorus.errors import EngineError, EngineOutOfMemory, InvalidInput
from synthesis.engines import emulated_device, load_engine
from synthesis.engines.base import Engine, ReferenceAudio
from synthesis.engines.device_profiles import GB, DeviceProfile
from synthesis.engines.emulated_device import EmulatedDevice
from synthesis.engines.synthetic import GiB, SyntheticEngine

REPO_ROOT = Path(__file__).resolve().parents[2]
FAST: dict[str, Any] = {"first_chunk_delay_s": 0.0, "rtf": 0.0}


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Any]:
    """Build-and-load engines in this test's own state folder; close them afterwards."""
    engines: list[SyntheticEngine] = []

    def build(**options: Any) -> SyntheticEngine:
        engine = SyntheticEngine(state_dir=tmp_path, **options)
        engine.load()
        engines.append(engine)
        return engine

    yield build
    for engine in engines:
        engine.close()


def collect(engine: SyntheticEngine, text: str, speed: float = 1.0, **kw: Any) -> np.ndarray:
    return np.concatenate(list(engine.synthesize(text=text, voice=kw.get("voice"), speed=speed)))


# --- output ---------------------------------------------------------------------


def test_is_an_engine_and_reports_its_device(make: Any) -> None:
    engine = make(device="emu3", model_memory_bytes=3 * GiB, **FAST)
    assert isinstance(engine, Engine)
    info = engine.info()
    assert (info.name, info.sample_rate, info.device) == ("synthetic", 24000, "emulated:emu3")
    assert info.memory_bytes == 3 * GiB


def test_same_text_gives_identical_samples(make: Any) -> None:
    first, second = make(**FAST), make(**FAST)
    a = collect(first, "Hello there, world.")
    np.testing.assert_array_equal(a, collect(second, "Hello there, world."))
    assert not np.array_equal(a, collect(first, "Hello there, world!"))
    assert a.dtype == np.float32
    assert float(np.abs(a).max()) == pytest.approx(0.3, abs=0.01)


def test_duration_follows_text_length_and_speed(make: Any) -> None:
    engine = make(**FAST)
    rate = engine.sample_rate
    assert len(collect(engine, "x" * 50)) == round(50 * 0.06 * rate)
    assert len(collect(engine, "x" * 100)) == round(100 * 0.06 * rate)
    assert len(collect(engine, "x" * 50, speed=2.0)) == round(50 * 0.06 / 2 * rate)
    assert len(collect(engine, "x" * 50, speed=0.5)) == round(50 * 0.06 / 0.5 * rate)
    assert len(collect(engine, "hi")) == round(0.5 * rate)  # floor of half a second


def test_streams_in_chunks_of_chunk_s(make: Any) -> None:
    engine = make(chunk_s=0.25, sample_rate=16000, **FAST)
    chunks = list(engine.synthesize(text="x" * 30, voice=None))  # 1.8 s of audio
    assert [len(c) for c in chunks] == [4000] * 7 + [800]


def test_voice_changes_the_signal_deterministically(make: Any) -> None:
    engine = make(**FAST)
    rng = np.random.default_rng(1)
    alice = ReferenceAudio(samples=rng.standard_normal(48000).astype(np.float32), sample_rate=16000)
    bob = ReferenceAudio(samples=rng.standard_normal(48000).astype(np.float32), sample_rate=16000)
    voice_a, voice_b = engine.prepare_voice(alice), engine.prepare_voice(bob)
    assert voice_a == engine.prepare_voice(alice)
    assert voice_a.data["duration_s"] == 3.0
    assert len(voice_a.data["fingerprint"]) == 64
    with_a = collect(engine, "Same words.", voice=voice_a)
    np.testing.assert_array_equal(with_a, collect(engine, "Same words.", voice=voice_a))
    assert not np.array_equal(with_a, collect(engine, "Same words.", voice=voice_b))


def test_instruction_changes_the_signal_deterministically(make: Any) -> None:
    engine = make(**FAST)
    plain = collect(engine, "Same words.")
    styled = np.concatenate(
        list(engine.synthesize(text="Same words.", voice=None, instruction="Cheerfully."))
    )
    assert len(styled) == len(plain)
    assert not np.array_equal(styled, plain)
    again = engine.synthesize(text="Same words.", voice=None, instruction="Cheerfully.")
    np.testing.assert_array_equal(np.concatenate(list(again)), styled)


def test_a_dumped_voice_loads_back(make: Any) -> None:
    engine = make(**FAST)
    reference = ReferenceAudio(samples=np.ones(16000, dtype=np.float32), sample_rate=16000)
    voice = engine.prepare_voice(reference)
    assert engine.load_voice(engine.dump_voice(voice)) == voice
    assert engine.supports_streaming_speed is True
    with pytest.raises(EngineError):
        engine.load_voice(b'{"engine": "espeak", "data": {}}')


def test_rejects_bad_speed_and_use_before_load(tmp_path: Path) -> None:
    engine = SyntheticEngine(state_dir=tmp_path, **FAST)
    with pytest.raises(EngineError):
        engine.synthesize(text="hi", voice=None)
    engine.load()
    with pytest.raises(InvalidInput):
        engine.synthesize(text="hi", voice=None, speed=0.1)
    engine.close()


# --- timing -----------------------------------------------------------------------


def test_first_chunk_arrives_after_the_first_chunk_delay(make: Any) -> None:
    engine = make(first_chunk_delay_s=0.3, rtf=0.2, chunk_s=0.5)
    started = time.monotonic()
    stream = engine.synthesize(text="x" * 40, voice=None)  # 2.4 s of audio, 5 chunks
    next(stream)
    first = time.monotonic() - started
    assert first == pytest.approx(0.3 + 0.2 * 0.5, abs=0.05)
    for _ in stream:
        pass
    total = time.monotonic() - started
    assert total == pytest.approx(0.3 + 0.2 * 2.4, abs=0.08)


# Timing for the curve tests: 0.3 s to the first chunk, 0.38 s after it alone.
CURVE: dict[str, Any] = {"first_chunk_delay_s": 0.2, "rtf": 0.4, "chunk_s": 0.25}
CURVE_TEXT = "x" * 20  # 1.2 s of audio: one 0.25 s first chunk, then 0.95 s at rtf 0.4


def run_together(engine: SyntheticEngine, streams: int) -> list[tuple[float, float]]:
    """(first chunk, total) seconds of `streams` syntheses started together."""
    results: list[tuple[float, float]] = []
    start = threading.Barrier(streams)

    def run() -> None:
        start.wait()
        began = time.monotonic()
        first = None
        for _ in engine.synthesize(text=CURVE_TEXT, voice=None):
            first = first or time.monotonic() - began
        assert first is not None
        results.append((first, time.monotonic() - began))

    threads = [threading.Thread(target=run) for _ in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def curve_misfits(engine: SyntheticEngine) -> list[str]:
    """Where 1, 3 and 5 streams started together stray more than 5 % from the
    profile's curve (empty when they all fit)."""
    profile = engine.profile
    first_alone = 0.2 + 0.4 * 0.25
    rest_alone = 0.4 * 0.95
    misfits: list[str] = []

    def check(what: str, value: float, expected: float) -> None:
        if value != pytest.approx(expected, rel=0.05):
            misfits.append(f"{what}: {value:.3f}, expected {expected:.3f}")

    ((first_1, total_1),) = run_together(engine, 1)
    check("first chunk alone (s)", first_1, first_alone)
    check("total alone (s)", total_1, first_alone + rest_alone)
    for streams in (3, 5):
        # Speed relative to one stream alone, as the profile's ratios say.
        first_ratio = profile.slowdown(streams, first=True)
        total_ratio = (
            first_alone * first_ratio + rest_alone * profile.slowdown(streams, first=False)
        ) / (first_alone + rest_alone)
        for first, total in run_together(engine, streams):
            check(f"{streams} streams, first chunk ratio", first / first_1, first_ratio)
            check(f"{streams} streams, total ratio", total / total_1, total_ratio)
    return misfits


def test_threads_on_one_device_follow_the_profile_curve(make: Any) -> None:
    """Wall-clock timing on a shared host: a run the host delayed outside the
    device (the GIL, ledger writes, a late last wake-up) is measured again, up to
    three runs. A device that serialized its streams (5 streams at 5x) or ignored
    them (1x) misses the curve on every run."""
    engine = make(**CURVE)
    for _ in range(3):
        misfits = curve_misfits(engine)
        if not misfits:
            return
    pytest.fail("the streams missed the profile's curve:\n" + "\n".join(misfits))


def test_a_late_wake_up_is_taken_off_the_streams_next_work(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy host wakes a sleeping thread late; the emulated card's time runs on
    meanwhile, so a stream's chunks do not each add the host's lag (ten chunks
    would take ten lags longer than the profile says)."""
    engine = make(**CURVE)
    clock = [1000.0]

    def late_sleep(seconds: float) -> None:
        clock[0] += seconds + 0.03  # every wake-up 30 ms late

    monkeypatch.setattr(emulated_device.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(emulated_device.time, "sleep", late_sleep)
    started = clock[0]
    with engine.emulated.stream(engine="synthetic") as stream:
        for _ in range(10):
            stream.spend(0.04, first=False)

    assert clock[0] - started == pytest.approx(0.4, abs=0.031)  # one lag at most, not ten


# Two streams at once take twice as long for their first chunk as one alone.
STEEP = DeviceProfile(
    name="steep",
    memory_bytes=16 * GB,
    model_bytes=0,
    stream_bytes=0,
    first_audio_s=(1.0, 2.0),
    total_s=(2.0, 4.0),
)


def test_a_stream_feels_anothers_start_at_once_not_at_its_next_wake_up(
    tmp_path: Path,
) -> None:
    """The device's clock reckons each stream's work exactly: with a wake-up only
    every 10 s, a stream of 0.4 s of work that another joins after 0.1 s still
    ends at 0.1 + 0.3 x 2 s. Reckoned at the wake-up it would end at 0.4 s."""
    device = EmulatedDevice(tmp_path, "steep", STEEP, quantum_s=10.0)
    ended: list[float] = []
    started = time.monotonic()

    def first_stream() -> None:
        with device.stream(engine="synthetic") as stream:
            stream.spend(0.4, first=True)
            ended.append(time.monotonic() - started)

    thread = threading.Thread(target=first_stream)
    thread.start()
    time.sleep(0.1)
    with device.stream(engine="synthetic"):
        thread.join()
    assert ended[0] == pytest.approx(0.1 + 0.3 * 2, abs=0.05)


def test_a_slow_ledger_does_not_delay_a_streams_first_chunk(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger's bookkeeping is the emulator's, not the card's: a stream is on
    the card from when it was asked for, however long its reservation took."""
    engine = make(first_chunk_delay_s=0.3, rtf=0.2, chunk_s=0.5)
    write = emulated_device.MemoryLedger._write

    def slow_write(self: Any, *args: Any, **kwargs: Any) -> None:
        time.sleep(0.15)
        write(self, *args, **kwargs)

    monkeypatch.setattr(emulated_device.MemoryLedger, "_write", slow_write)
    started = time.monotonic()
    stream = engine.synthesize(text="x" * 40, voice=None)
    next(stream)
    first = time.monotonic() - started
    stream.close()
    assert first == pytest.approx(0.3 + 0.2 * 0.5, abs=0.05)


def test_a_text_streams_wait_for_its_text_is_no_work_of_the_cards(make: Any) -> None:
    """A text stream holds its place on the card while it waits for text; its
    first chunk still takes the card's whole first-chunk time once text comes."""
    engine = make(first_chunk_delay_s=0.3, rtf=0.2, chunk_s=0.25, seconds_per_char=0.05)

    def late_text() -> Iterator[str]:
        time.sleep(0.4)
        yield "Hello there, this came late."

    started = time.monotonic()
    stream = engine.synthesize_text_stream(texts=late_text(), voice=None)
    next(stream)
    first = time.monotonic() - started
    stream.close()
    assert first == pytest.approx(0.4 + 0.3 + 0.2 * 0.25, abs=0.05)


def test_a_torn_clock_record_is_read_again() -> None:
    clock = emulated_device.DeviceClock(streams=3, since=12.5, first=1.25, rest=0.5)
    raw = clock.pack()
    assert emulated_device.DeviceClock.unpack(raw) == clock
    # The head of one record, the tail of the next one.
    torn = raw[:16] + emulated_device.DeviceClock(streams=3, since=13.0, first=2.0).pack()[16:]
    assert emulated_device.DeviceClock.unpack(torn) is None
    assert emulated_device.DeviceClock.unpack(raw[:-1]) is None


def test_five_streams_give_the_t4_throughput_not_a_fifth_each(make: Any) -> None:
    engine = make(**CURVE)

    def five_over_one() -> float:
        ((_, alone),) = run_together(engine, 1)
        return max(total for _, total in run_together(engine, 5)) / alone

    # The best of three: a host busy with other work only ever delays the emulated
    # streams' wake-ups (a CI run with three test processes on two cores once gave
    # 1.73), never speeds them up.
    ratio = min(five_over_one() for _ in range(3))
    # Published: five streams take 1.55x as long as one, so 3.2x the throughput;
    # a time-sliced device would take 5x as long.
    assert ratio == pytest.approx(1.55, rel=0.06)
    assert 5 / ratio > 3.0


def test_a_stream_past_the_memory_fails_like_cuda_out_of_memory(make: Any) -> None:
    engine = make(
        **CURVE,
        device_memory_bytes=10 * GiB,
        model_memory_bytes=6 * GiB,
        stream_memory_bytes=2 * GiB,
    )
    first, second = (engine.synthesize(text=CURVE_TEXT, voice=None) for _ in range(2))
    next(first)
    next(second)  # two streams fit beside the model
    third = engine.synthesize(text=CURVE_TEXT, voice=None)
    with pytest.raises(
        EngineOutOfMemory, match=r"out of memory: 2\.0 GiB requested, 0\.0 GiB free"
    ):
        next(third)
    first.close()  # a finished (or cancelled) stream frees its memory at once
    assert next(engine.synthesize(text=CURVE_TEXT, voice=None)).size > 0
    second.close()


CHILD = textwrap.dedent(
    """
    import sys, time
    from synthesis.engines.synthetic import SyntheticEngine
    state_dir, device, text = sys.argv[1], sys.argv[2], sys.argv[3]
    engine = SyntheticEngine(
        state_dir=state_dir, device=device, first_chunk_delay_s=0.0, rtf=1.0, chunk_s=0.5,
        model_memory_bytes=0,
    )
    engine.load()
    print("ready", flush=True)
    sys.stdin.readline()  # start together
    started = time.monotonic()
    for _ in engine.synthesize(text=text, voice=None):
        pass
    print(time.monotonic() - started, flush=True)
    """
)


def synthesize_in_processes(state_dir: Path, devices: list[str], text: str) -> list[float]:
    """Run one synthesis per device name, each in its own process, started together."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(state_dir), device, text],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for device in devices
    ]
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        return [float(child.communicate(timeout=20)[0]) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()


def test_processes_on_one_device_follow_the_profile_curve(tmp_path: Path) -> None:
    text = "x" * 20  # 1.2 s of one-stream work (rtf 1.0, no first-chunk delay)
    (alone,) = synthesize_in_processes(tmp_path, ["emu0"], text)
    assert alone == pytest.approx(1.2, rel=0.2)
    together = synthesize_in_processes(tmp_path, ["emu0"] * 3, text)
    profile = SyntheticEngine().profile
    # The first 0.5 s chunk follows the first-audio curve, the rest the other one.
    slowdown = (
        0.5 * profile.slowdown(3, first=True) + 0.7 * profile.slowdown(3, first=False)
    ) / 1.2
    assert all(t / alone == pytest.approx(slowdown, rel=0.08) for t in together), (
        alone,
        together,
    )


def test_processes_on_different_devices_do_not_slow_each_other(tmp_path: Path) -> None:
    text = "x" * 20
    together = synthesize_in_processes(tmp_path, ["emu0", "emu1"], text)
    assert all(t / 1.2 < 1.3 for t in together), together


# --- memory -----------------------------------------------------------------------


def test_memory_budget_is_enforced_and_freed_on_close(make: Any, tmp_path: Path) -> None:
    budget: dict[str, Any] = {
        "device_memory_bytes": 10 * GiB,
        "model_memory_bytes": 4 * GiB,
        **FAST,
    }
    first, _second = make(**budget), make(**budget)
    third = SyntheticEngine(state_dir=tmp_path, **budget)
    with pytest.raises(EngineOutOfMemory) as caught:
        third.load()
    assert caught.value.message == (
        "emulated GPU emu0 out of memory: 4.0 GiB requested, 2.0 GiB free of 10.0 GiB"
    )
    assert caught.value.details["free_bytes"] == 2 * GiB

    make(device="emu1", **budget)  # another device has its own memory
    first.close()
    third.load()
    assert third.ledger.usage().used_bytes == 8 * GiB
    third.close()


def test_load_engine_passes_options_and_reserves_memory(tmp_path: Path) -> None:
    engine = load_engine("synthetic", {"state_dir": str(tmp_path), "model_memory_bytes": "1024"})
    assert isinstance(engine, SyntheticEngine)
    assert engine.ledger.usage().used_bytes == 1024
    engine.close()
    assert engine.ledger.usage().used_bytes == 0


def test_engines_of_two_data_folders_do_not_share_device_memory(
    settings: Any, tmp_path: Path
) -> None:
    """Two stacks on one host, each with its own CHORUS_DATA_DIR: each has its own
    emu0, so the second stack's model fits beside the first's."""
    budget: dict[str, Any] = {"device_memory_bytes": 10 * GiB, "model_memory_bytes": 8 * GiB}
    engines = []
    try:
        for stack in ("alice-stack", "bob-stack"):
            settings.DATA_DIR = tmp_path / stack
            engine = SyntheticEngine(**budget, **FAST)
            engines.append(engine)
            engine.load()  # the second one failed engine_out_of_memory on a shared folder

        for stack, engine in zip(("alice-stack", "bob-stack"), engines, strict=True):
            assert engine.ledger.path == tmp_path / stack / "emulated-gpu" / "emu0.ledger.json"
            assert engine.ledger.usage().used_bytes == 8 * GiB
    finally:
        for engine in engines:
            engine.close()


HOLDER = textwrap.dedent(
    """
    import os, sys
    from synthesis.engines.synthetic import GiB, SyntheticEngine
    engine = SyntheticEngine(
        state_dir=sys.argv[1], device_memory_bytes=10 * GiB, model_memory_bytes=8 * GiB
    )
    engine.load()
    print("ready", flush=True)
    if sys.argv[2] == "exit":
        sys.exit(0)  # no close(): atexit must release the reservation
    sys.stdin.readline()  # hold the memory until killed
    """
)


def start_holder(state_dir: Path, mode: str) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(state_dir), mode],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    return child


def test_a_killed_process_reservation_is_pruned(tmp_path: Path) -> None:
    child = start_holder(tmp_path, "hold")
    engine = SyntheticEngine(
        state_dir=tmp_path, device_memory_bytes=10 * GiB, model_memory_bytes=8 * GiB
    )
    with pytest.raises(EngineOutOfMemory):
        engine.load()  # the other process really holds the memory
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=10)
    engine.load()
    usage = engine.ledger.usage()
    assert usage.used_bytes == 8 * GiB
    assert {entry["pid"] for entry in usage.reservations.values()} == {os.getpid()}
    engine.close()


def test_a_process_that_exits_without_close_releases_its_memory(tmp_path: Path) -> None:
    child = start_holder(tmp_path, "exit")
    child.wait(timeout=10)
    ledger = json.loads((tmp_path / "emu0.ledger.json").read_text())
    assert ledger["reservations"] == {}  # released by atexit, not just pruned


def test_a_reused_pid_does_not_keep_a_dead_reservation(make: Any, tmp_path: Path) -> None:
    # Our own pid, but a start time that is not ours: the pid was recycled.
    ledger_file = tmp_path / "emu0.ledger.json"
    stale = {"pid": os.getpid(), "started": "1", "bytes": 15 * GiB, "engine": "synthetic"}
    ledger_file.write_text(json.dumps({"reservations": {f"{os.getpid()}:old": stale}}))
    engine = make(**FAST)  # 2 GiB fits only once the stale 15 GiB is gone
    assert engine.ledger.usage().used_bytes == engine.model_memory_bytes


def test_a_damaged_ledger_is_rebuilt(make: Any, tmp_path: Path) -> None:
    (tmp_path / "emu0.ledger.json").write_text("{not json")
    engine = make(**FAST)
    assert engine.ledger.usage().used_bytes == engine.model_memory_bytes


def test_a_text_stream_is_spoken_as_its_text_arrives_with_one_first_chunk_delay(make: Any) -> None:
    engine = make(first_chunk_delay_s=0.0, rtf=0.0, chunk_s=0.25, seconds_per_char=0.05)
    pulled: list[str] = []
    made: list[tuple[int, int]] = []  # (pieces pulled so far, samples) per chunk

    def pieces() -> Iterator[str]:
        for piece in ["Hello ", "there, ", "this is ", "streamed."]:
            pulled.append(piece)
            yield piece

    for chunk in engine.synthesize_text_stream(texts=pieces(), voice=None):
        made.append((len(pulled), len(chunk)))
    text = "Hello there, this is streamed."
    assert sum(n for _, n in made) == round(len(text) * 0.05 * engine.sample_rate)
    # The first chunk (0.25 s: 5 characters) went out before the rest was read.
    assert made[0] == (1, round(0.25 * engine.sample_rate))
    assert engine.streams_text
    assert not make(streams_text="false").streams_text
