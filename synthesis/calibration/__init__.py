"""Every GPU sizes itself: measure the loaded engine at 1, 2, 3, ... streams at
once and keep the curve as a device profile (see docs/calibration.md).

* `measure`: runs the engine and measures (no database);
* `identity`: what keys a profile (card, engine, model, flags, versions);
* `synthesis.services.device_profiles`: stores profiles and makes the workers
  of one card wait for the one that calibrates.
"""
