"""put_patiently: a finished job's audio written through a storage outage."""

from __future__ import annotations

import time
from typing import Any

import pytest

from chorus.errors import NotFound, StorageError
from synthesis.storage.retry import FIRST_DELAY_S, MAX_DELAY_S, put_patiently


class FlakyStore:
    """A store that refuses the first `failures` writes, then keeps what it is given."""

    def __init__(self, failures: int, error: Exception | None = None) -> None:
        self.failures = failures
        self.error = error or StorageError("Object storage is unavailable.")
        self.tries = 0
        self.objects: dict[str, bytes] = {}

    def put(self, *, bucket: str, key: str, data: bytes, content_type: str) -> None:
        self.tries += 1
        if self.tries <= self.failures:
            raise self.error
        self.objects[f"{bucket}/{key}"] = data


def put(store: Any, *, window_s: float, pauses: list[float] | None = None) -> None:
    put_patiently(
        store,
        bucket="chorus-alice",
        key="jobs/1.wav",
        data=b"RIFF",
        content_type="audio/wav",
        window_s=window_s,
        sleep=pauses.append if pauses is not None else time.sleep,
    )


def test_a_write_refused_for_a_while_lands_once_the_store_is_back() -> None:
    store, pauses = FlakyStore(failures=6), []

    put(store, window_s=60, pauses=pauses)

    assert store.objects == {"chorus-alice/jobs/1.wav": b"RIFF"}
    assert store.tries == 7
    # Backoff with jitter: each pause within half and one and a half times its
    # step, the steps doubling up to the cap.
    steps = [min(FIRST_DELAY_S * 2**n, MAX_DELAY_S) for n in range(6)]
    for pause, step in zip(pauses, steps, strict=True):
        assert 0.5 * step <= pause <= 1.5 * step


def test_a_write_still_refused_when_the_window_is_up_raises_the_storage_error() -> None:
    store = FlakyStore(failures=1000)
    started = time.monotonic()

    with pytest.raises(StorageError):
        put(store, window_s=1.0)

    assert time.monotonic() - started >= 1.0  # the whole window, not a few tries
    assert store.tries >= 3
    assert store.objects == {}


def test_a_window_of_zero_tries_once() -> None:
    store = FlakyStore(failures=1)

    with pytest.raises(StorageError):
        put(store, window_s=0, pauses=[])

    assert store.tries == 1


def test_errors_other_than_an_unavailable_store_are_not_tried_again() -> None:
    store = FlakyStore(failures=1, error=NotFound("No such bucket."))

    with pytest.raises(NotFound):
        put(store, window_s=60, pauses=[])

    assert store.tries == 1
