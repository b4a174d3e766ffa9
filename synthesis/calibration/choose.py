"""A GPU worker's stream limits under `CHORUS_DEVICE_PROFILE=auto`: the profile
stored for its card, or measured now (the first worker of a new card), while the
other workers of that card wait for it (`services.device_profile_wait_or_claim`)."""

from __future__ import annotations

import logging

from django.conf import settings

from synthesis.calibration.identity import profile_key
from synthesis.calibration.measure import TEXT, calibrate
from synthesis.calibration.services import (
    device_profile_fail,
    device_profile_save,
    device_profile_wait_or_claim,
)
from synthesis.engines.base import Engine
from synthesis.engines.device_profiles import profile_from_json
from synthesis.stream_limits import LimitsChoice, limits_for_profile

log = logging.getLogger(__name__)

# A calibrating worker holds its card's row this long past its time bound
# (loading, the warm-up, storing) before a waiting worker takes it over.
HOLD_MARGIN_S = 120.0


def calibrated_limits(
    engine: Engine, *, worker: str, text: str = TEXT, samples: int = 4
) -> LimitsChoice:
    """Limits from the stored profile of `engine`'s card, or from measuring it
    (the engine is loaded then; it may be unloaded when this is called)."""
    key = profile_key(engine)
    outcome, row = device_profile_wait_or_claim(
        key=key, owner=worker, hold_s=settings.CALIBRATION_MAX_S + HOLD_MARGIN_S
    )
    if outcome == "stored":
        assert row.document is not None
        profile = profile_from_json(row.document)
        limits = limits_for_profile(profile)
        log.info("stream limits %s from the stored profile %s", limits.as_text(), key.short)
        return LimitsChoice(limits, "stored", profile_name=profile.name, profile_key=key.digest)
    log.info(
        "no profile stored for %s: calibrating (at most %.0f s)",
        key.short,
        settings.CALIBRATION_MAX_S,
    )
    try:
        engine.load()
        calibration = calibrate(
            engine,
            name=f"calibrated-{key.digest[:12]}",
            stop_slowdown=max(settings.FIRST_AUDIO_SLOWDOWN, settings.HIGH_FIRST_AUDIO_SLOWDOWN),
            max_streams=settings.CALIBRATION_MAX_STREAMS,
            max_seconds=settings.CALIBRATION_MAX_S,
            text=text,
            samples=samples,
        )
        limits = limits_for_profile(calibration.profile())
    except BaseException as exc:
        device_profile_fail(key=key, owner=worker, error=f"{type(exc).__name__}: {exc}")
        raise
    device_profile_save(key=key, owner=worker, calibration=calibration, limits=limits)
    log.info(
        "calibrated %s in %.0f s (%s): stream limits %s",
        key.short,
        calibration.seconds,
        calibration.stopped_because,
        limits.as_text(),
    )
    return LimitsChoice(limits, "calibrated", profile_name=calibration.name, profile_key=key.digest)
