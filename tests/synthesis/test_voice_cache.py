"""VoicePromptCache with the synthetic engine: memory, then storage, then compute."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from synthesis.engines.base import ReferenceAudio
from synthesis.engines.synthetic import SyntheticEngine
from synthesis.voice_cache import VoicePromptCache

ALICE, BOB = uuid.uuid4(), uuid.uuid4()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[SyntheticEngine]:
    loaded = SyntheticEngine(state_dir=tmp_path, first_chunk_delay_s=0.0, rtf=0.0)
    loaded.load()
    yield loaded
    loaded.close()


class Storage:
    """A dict-backed store of prepared prompts, counting how often each side is used."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.loads = 0
        self.stores = 0
        self.references = 0

    def fetch(
        self,
        cache: VoicePromptCache,
        engine: SyntheticEngine,
        *,
        tenant: uuid.UUID = ALICE,
        voice: str = "v1",
        version: int = 1,
        samples: np.ndarray | None = None,
    ) -> tuple[Any, str, float]:
        key = f"{tenant}/{voice}/{version}/{engine.name}"

        def load_reference() -> ReferenceAudio:
            self.references += 1
            audio = samples if samples is not None else np.full(16000, version, np.float32)
            return ReferenceAudio(samples=audio, sample_rate=16000)

        def load_stored() -> bytes | None:
            self.loads += 1
            return self.objects.get(key)

        def store(data: bytes) -> None:
            self.stores += 1
            self.objects[key] = data

        return cache.get_or_prepare(
            tenant_id=tenant,
            voice_id=voice,
            version=version,
            engine=engine,
            load_reference=load_reference,
            load_stored=load_stored,
            store=store,
        )


def test_a_computed_voice_is_stored_and_then_served_from_memory(engine: SyntheticEngine) -> None:
    cache, storage = VoicePromptCache(), Storage()
    first, source, seconds = storage.fetch(cache, engine)
    assert (source, storage.references, storage.stores) == ("computed", 1, 1)
    assert seconds >= 0
    again, source, _ = storage.fetch(cache, engine)
    assert source == "memory"
    assert again is first
    assert (storage.loads, storage.references) == (1, 1)


def test_after_a_worker_restart_the_stored_prompt_is_used(engine: SyntheticEngine) -> None:
    storage = Storage()
    computed, _, _ = storage.fetch(VoicePromptCache(), engine)
    restarted = VoicePromptCache()
    loaded, source, _ = storage.fetch(restarted, engine)
    assert source == "storage"
    assert loaded == computed
    assert storage.references == 1  # the reference audio was not needed again
    assert storage.fetch(restarted, engine)[1] == "memory"


def test_a_new_voice_version_is_computed_afresh(engine: SyntheticEngine) -> None:
    cache, storage = VoicePromptCache(), Storage()
    old, _, _ = storage.fetch(cache, engine, version=1)
    new, source, _ = storage.fetch(cache, engine, version=2)
    assert source == "computed"
    assert new != old


def test_tenants_with_identical_audio_get_separate_entries(engine: SyntheticEngine) -> None:
    cache, storage = VoicePromptCache(), Storage()
    audio = np.full(16000, 0.5, np.float32)
    alice, source_a, _ = storage.fetch(cache, engine, tenant=ALICE, samples=audio)
    bob, source_b, _ = storage.fetch(cache, engine, tenant=BOB, samples=audio)
    assert (source_a, source_b) == ("computed", "computed")
    assert alice == bob  # the same prompt, computed twice ...
    assert alice is not bob  # ... but never one shared object
    assert len(cache) == 2
    assert len(storage.objects) == 2

    assert cache.evict_voice(ALICE, "v1") == 1
    assert storage.fetch(cache, engine, tenant=BOB, samples=audio)[1] == "memory"
    assert storage.fetch(cache, engine, tenant=ALICE, samples=audio)[1] == "storage"


def test_the_least_recently_used_voice_is_dropped(engine: SyntheticEngine) -> None:
    cache, storage = VoicePromptCache(max_items=2), Storage()
    storage.fetch(cache, engine, voice="a")
    storage.fetch(cache, engine, voice="b")
    storage.fetch(cache, engine, voice="a")  # now b is the oldest
    storage.fetch(cache, engine, voice="c")
    assert len(cache) == 2
    assert storage.fetch(cache, engine, voice="a")[1] == "memory"
    assert storage.fetch(cache, engine, voice="b")[1] == "storage"


def test_a_failing_store_or_damaged_stored_prompt_is_not_fatal(engine: SyntheticEngine) -> None:
    cache = VoicePromptCache()

    def broken_store(data: bytes) -> None:
        raise OSError("bucket unavailable")

    def reference() -> ReferenceAudio:
        return ReferenceAudio(samples=np.ones(16000, np.float32), sample_rate=16000)

    options: dict[str, Any] = {"tenant_id": ALICE, "version": 1, "engine": engine}
    voice, source, _ = cache.get_or_prepare(
        voice_id="x",
        load_reference=reference,
        load_stored=lambda: None,
        store=broken_store,
        **options,
    )
    assert source == "computed"
    damaged, source, _ = cache.get_or_prepare(
        voice_id="y",
        load_reference=reference,
        load_stored=lambda: b"garbage",
        store=lambda data: None,
        **options,
    )
    assert source == "computed"
    assert damaged == voice


def test_threads_share_the_cache_safely(engine: SyntheticEngine) -> None:
    cache, storage = VoicePromptCache(max_items=4), Storage()
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            for round_ in range(20):
                storage.fetch(cache, engine, voice=f"v{(index + round_) % 6}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors
    assert len(cache) == 4
