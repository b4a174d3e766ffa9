"""API key format: `ck_` + 43 URL-safe random characters (256 bits).

The first characters after `ck_` double as a lookup prefix so a request finds its
row with one indexed query; the full key is then compared by SHA-256 hash in
constant time. Neither the key nor anything that recovers it is stored.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

KEY_MARKER = "ck_"
PREFIX_LENGTH = 10
_RANDOM_BYTES = 32


@dataclass(frozen=True)
class NewKey:
    raw: str
    prefix: str
    key_hash: str


def generate_key() -> NewKey:
    raw = KEY_MARKER + secrets.token_urlsafe(_RANDOM_BYTES)
    return NewKey(raw=raw, prefix=key_prefix(raw), key_hash=hash_key(raw))


def key_prefix(raw: str) -> str:
    return raw[len(KEY_MARKER) : len(KEY_MARKER) + PREFIX_LENGTH]


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def looks_like_key(raw: str) -> bool:
    return raw.startswith(KEY_MARKER) and len(raw) >= len(KEY_MARKER) + 32
