"""How many streams one GPU worker runs at once, by priority.

One worker process owns one device and one loaded engine, and runs several
jobs on it at once (threads sharing the engine). How many is a trade between
throughput and first audio, and it differs by priority, the way a telephone
exchange reserves trunks for priority calls:

* `low` jobs start only while fewer than `low` streams of any priority run;
* `normal` jobs while fewer than `normal` run;
* `high` jobs while fewer than `high` run (up to what the memory holds).

So a card full of bulk `low` work always has room for a `high` stream at
once, and that stream's first audio is only slowed by the few `low` streams
beside it. The worker's consumer asks the broker only for the priorities still
admitted (see `synthesis.lanes`): nothing is ever taken from the broker that
cannot start at once, so no message waits inside a busy worker.

The limits come from the card's device profile: `normal` is the most
streams whose first audio stays within `CHORUS_FIRST_AUDIO_SLOWDOWN` (1.5x) of
a lone stream's, `low` leaves room for one `high` stream within
`CHORUS_HIGH_FIRST_AUDIO_SLOWDOWN` (1.2x), and `high` is what memory holds
(at most twice `normal`). On a T4 with CosyVoice2: 2 / 5 / 7. The synthetic
engine's profile is its own option; other engines that leave concurrency to
the device (cosyvoice2: calls side by side on one model instance are proven
correct on the real upstream code) use `CHORUS_DEVICE_PROFILE`: `auto` (the
default) measures the card once and stores its profile (`synthesis.calibration`),
or a shipped name, or a JSON file describing the card. Engines that cannot run
calls side by side (espeak) get one stream per loaded model, and calibrate
nothing. `CHORUS_WORKER_STREAMS` sets the limits by hand: `4` or `2,5,7`.
A worker that takes only `synth.low` runs the `normal` count for it (`serving`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings

from synthesis.engines import engine_class
from synthesis.engines.device_profiles import DeviceProfile, get_profile


@dataclass(frozen=True)
class StreamLimits:
    low: int
    normal: int
    high: int

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.normal <= self.high:
            raise ValueError(
                f"stream limits must satisfy 1 <= low <= normal <= high, got {self.as_text()}"
            )

    @classmethod
    def parse(cls, text: str) -> StreamLimits:
        parts = [int(part) for part in text.replace(" ", "").split(",") if part]
        if len(parts) == 1:
            return cls(parts[0], parts[0], parts[0])
        if len(parts) == 3:
            return cls(*parts)
        raise ValueError(f"expected N or LOW,NORMAL,HIGH, got {text!r}")

    @classmethod
    def from_profile(
        cls, profile: DeviceProfile, *, first_audio_slowdown: float, high_slowdown: float
    ) -> StreamLimits:
        memory = max(1, profile.memory_capacity_streams())
        normal = min(profile.streams_within(first_audio_slowdown), memory)
        low = min(max(1, profile.streams_within(high_slowdown) - 1), normal)
        return cls(low=low, normal=normal, high=max(normal, min(memory, 2 * normal)))

    def serving(self, queues: Sequence[str]) -> StreamLimits:
        """The limits of a worker that takes `queues`. One that takes only `low`
        work never sees the `high` stream its `low` limit keeps room for, so it
        runs the card's `normal` count for its low work (a low-only GPU pool)."""
        if set(queues) & set(settings.SYNTH_QUEUES) == {"synth.low"}:
            return StreamLimits(self.normal, self.normal, self.normal)
        return self

    def as_text(self) -> str:
        return f"{self.low},{self.normal},{self.high}"


@dataclass(frozen=True)
class LimitsChoice:
    """A worker's limits and why: `source` is `by hand`, `engine` (one stream
    per model), `profile` (named or a JSON file), `stored` or `calibrated`."""

    limits: StreamLimits
    source: str
    profile_name: str = ""
    profile_key: str | None = None  # a calibrated profile's row

    def serving(self, queues: Sequence[str]) -> LimitsChoice:
        """Limits set by hand are taken as they are; a card's, for `queues`."""
        if self.source == "by hand":
            return self
        return replace(self, limits=self.limits.serving(queues))


def limits_for_profile(profile: DeviceProfile) -> StreamLimits:
    return StreamLimits.from_profile(
        profile,
        first_audio_slowdown=settings.FIRST_AUDIO_SLOWDOWN,
        high_slowdown=settings.HIGH_FIRST_AUDIO_SLOWDOWN,
    )


def limits_without_engine(
    engine: str | None = None, options: dict[str, Any] | None = None
) -> LimitsChoice | None:
    """The limits for a worker of this configuration, without loading its engine;
    None where the card must be looked up or measured (`auto`)."""
    if settings.WORKER_STREAMS:
        return LimitsChoice(StreamLimits.parse(settings.WORKER_STREAMS), "by hand")
    engine = engine or settings.ENGINE
    options = settings.ENGINE_OPTIONS if options is None else options
    auto = settings.DEVICE_PROFILE == "auto"
    if engine == "synthetic":
        from synthesis.engines.synthetic import SyntheticEngine

        synthetic = SyntheticEngine(**options)
        if auto and synthetic.calibrate:
            return None
        # Its curve is an option: measuring it would only find it again.
        profile = synthetic.profile
    else:
        per_instance = getattr(engine_class(engine), "max_concurrent_streams", 1)
        if per_instance is not None:
            # Calls must not overlap beyond this on one loaded model; cosyvoice2
            # may load several instances (`slots`).
            instances = int(str(options.get("slots", 1) or 1))
            streams = per_instance * instances
            return LimitsChoice(StreamLimits(streams, streams, streams), "engine")
        if auto:
            return None
        profile = get_profile(settings.DEVICE_PROFILE)
    return LimitsChoice(limits_for_profile(profile), "profile", profile_name=profile.name)


def worker_stream_limits(
    engine: str | None = None, options: dict[str, Any] | None = None
) -> StreamLimits:
    """The limits for a worker of this configuration, without loading its engine
    (ValueError where only a calibration can tell)."""
    choice = limits_without_engine(engine, options)
    if choice is None:
        raise ValueError("CHORUS_DEVICE_PROFILE=auto: this card's limits need its engine loaded")
    return choice.limits
