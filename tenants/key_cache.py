"""Authenticated API keys, remembered for a few seconds in each process.

Every request authenticates, and the key's row (with its tenant and plan) is the
one query every request made. It changes rarely, so each process keeps a key it
has looked up for `API_KEY_CACHE_S` seconds (`CHORUS_API_KEY_CACHE_S`, default
5; 0 turns the cache off). That is how promptly a change reaches every process:
a revoked key, a disabled tenant or a new plan takes effect in every web process
within that time, and at once in the process that revoked the key. Entries are
keyed by the key's SHA-256, never the key itself; unknown keys are not
remembered, so a wrong key always costs its own lookup.
"""

from __future__ import annotations

import time

from django.conf import settings

from tenants.models import ApiKey

# Past this many keys the cache starts over: a bound on memory, not an LRU (a
# process serves far fewer live keys).
MAX_KEYS = 10_000

_keys: dict[str, tuple[float, ApiKey]] = {}


def key_cache_get(key_hash: str) -> ApiKey | None:
    entry = _keys.get(key_hash)
    if entry is None:
        return None
    expires, key = entry
    if time.monotonic() >= expires:
        _keys.pop(key_hash, None)
        return None
    return key


def key_cache_put(key_hash: str, key: ApiKey) -> None:
    ttl = float(settings.API_KEY_CACHE_S)
    if ttl <= 0:
        return
    if len(_keys) >= MAX_KEYS:
        _keys.clear()
    _keys[key_hash] = (time.monotonic() + ttl, key)


def key_cache_forget(key_hash: str) -> None:
    _keys.pop(key_hash, None)


def key_cache_clear() -> None:
    _keys.clear()
