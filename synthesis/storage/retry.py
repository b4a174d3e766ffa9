"""Writing a finished job's audio through a storage outage.

Once the engine is done the audio is in hand. A store that refuses it for a
while (S3 restarting, a volume remounted) is waited for, with backoff and
jitter, rather than answered by putting the job back in its queue: that would
spend the GPU's seconds again and, seconds later, meet the same store.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from chorus.errors import StorageError
from synthesis.storage.base import Storage

log = logging.getLogger(__name__)

FIRST_DELAY_S = 0.5
# The longest pause between tries (before jitter): how long after the store's
# return a waiting write may take to notice it.
MAX_DELAY_S = 4.0


def put_patiently(
    storage: Storage,
    *,
    bucket: str,
    key: str,
    data: bytes,
    content_type: str,
    window_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """`storage.put`, tried again on a StorageError until `window_s` has passed
    since the first try (the last try at the end of the window); then its error.
    Keys are deterministic, so a write that landed but whose answer was lost is
    only written again."""
    deadline = time.monotonic() + window_s
    delay = FIRST_DELAY_S
    tries = 1
    while True:
        try:
            storage.put(bucket=bucket, key=key, data=data, content_type=content_type)
            if tries > 1:
                log.info("stored %s/%s at try %d", bucket, key, tries)
            return
        except StorageError as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            pause = min(delay * random.uniform(0.5, 1.5), left)
            log.warning(
                "storage write of %s/%s failed; trying again in %.1f s: %s",
                bucket,
                key,
                pause,
                exc.message,
            )
            sleep(pause)
            delay = min(delay * 2, MAX_DELAY_S)
            tries += 1
