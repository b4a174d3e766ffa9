"""Prepared voice prompts, kept per worker process and persisted across restarts.

Preparing a prompt is the expensive step of cloning (speech tokens, speaker
embedding, features), so a worker keeps recent ones in memory and the caller
stores each computed one (`store`) so a restarted worker loads it instead of
recomputing it. The tenant is part of every key: two tenants who upload
byte-identical audio still get separate entries, and evicting one tenant's voice
cannot touch another's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Literal

from synthesis.engines.base import Engine, PreparedVoice, ReferenceAudio

log = logging.getLogger(__name__)

Source = Literal["memory", "storage", "computed"]
# (tenant id, voice id, voice version, engine name); the ids as text, so that a
# lookup by the ids a message carries (`synthesis.prestart`) finds them too.
CacheKey = tuple[str, str, int, str]


def _key(tenant_id: Hashable, voice_id: Hashable, version: int, engine: str) -> CacheKey:
    return (str(tenant_id), str(voice_id), int(version), engine)


class VoicePromptCache:
    """A thread-safe LRU of prepared voices, bounded by `max_items`."""

    def __init__(self, max_items: int = 64) -> None:
        if max_items < 1:
            raise ValueError("max_items must be at least 1")
        self.max_items = max_items
        self._items: OrderedDict[CacheKey, PreparedVoice] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def get_or_prepare(
        self,
        *,
        tenant_id: Hashable,
        voice_id: Hashable,
        version: int,
        engine: Engine,
        load_reference: Callable[[], ReferenceAudio],
        load_stored: Callable[[], bytes | None],
        store: Callable[[bytes], None],
    ) -> tuple[PreparedVoice, Source, float]:
        """The prepared voice, where it came from, and the seconds spent getting it.

        Order: this process's memory, then the stored prompt, then computing it
        from the reference (and storing the result). Loading and computing happen
        outside the lock, so one slow voice does not stall lookups of others; two
        threads missing the same key at once may both compute it, which is
        harmless (same result, last one kept).
        """
        started = time.monotonic()
        key = _key(tenant_id, voice_id, version, engine.name)
        voice = self._take(key)
        if voice is not None:
            return voice, "memory", time.monotonic() - started

        source: Source = "storage"
        voice = self._load_stored(key, engine, load_stored)
        if voice is None:
            source = "computed"
            voice = engine.prepare_voice(load_reference())
            try:
                store(engine.dump_voice(voice))
            except Exception:
                # The voice is usable; only the next restart pays for computing it again.
                log.exception("could not store the prepared prompt for voice %s", key[:3])

        with self._lock:
            self._items[key] = voice
            self._items.move_to_end(key)
            while len(self._items) > self.max_items:
                self._items.popitem(last=False)
        return voice, source, time.monotonic() - started

    def peek(
        self, tenant_id: Hashable, voice_id: Hashable, version: int, engine: str
    ) -> PreparedVoice | None:
        """The prepared voice if this process has it in memory, else None: no I/O."""
        return self._take(_key(tenant_id, voice_id, version, engine))

    def _take(self, key: CacheKey) -> PreparedVoice | None:
        with self._lock:
            voice = self._items.get(key)
            if voice is not None:
                self._items.move_to_end(key)
            return voice

    def evict_voice(self, tenant_id: Hashable, voice_id: Hashable) -> int:
        """Forget every version of one tenant's voice, for every engine; return how many."""
        tenant, voice = str(tenant_id), str(voice_id)
        with self._lock:
            doomed = [k for k in self._items if k[0] == tenant and k[1] == voice]
            for key in doomed:
                del self._items[key]
        return len(doomed)

    @staticmethod
    def _load_stored(
        key: CacheKey, engine: Engine, load_stored: Callable[[], bytes | None]
    ) -> PreparedVoice | None:
        """The stored prompt, or None when there is none or it cannot be used."""
        try:
            data = load_stored()
            return None if data is None else engine.load_voice(data)
        except Exception:
            # A damaged or outdated stored prompt costs one recomputation, not the job.
            log.warning("ignoring the stored prompt for voice %s", key[:3], exc_info=True)
            return None
