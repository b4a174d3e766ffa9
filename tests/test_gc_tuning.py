"""Each web process tunes its garbage collection once the application is loaded
(`chorus.gc_tuning`): what was loaded is frozen, the young generation collected
less often."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from chorus.gc_tuning import YOUNG_COLLECTION_EVERY


def test_loading_the_web_application_tunes_the_collector(settings: Any) -> None:
    probe = (
        "import gc; before = gc.get_freeze_count(); import chorus.asgi; "
        "print(gc.get_threshold()[0], before, gc.get_freeze_count())"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=settings.BASE_DIR,
        env=os.environ,
        capture_output=True,
        text=True,
        check=True,
    )
    threshold, frozen_before, frozen_after = map(int, done.stdout.split())

    assert threshold == YOUNG_COLLECTION_EVERY
    assert frozen_before == 0
    assert frozen_after > 10_000  # Django, DRF and the project's modules
