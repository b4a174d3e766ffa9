"""Values the service must read back but must not keep in the clear (a webhook
endpoint's signing secret: a database dump or backup must not let its holder
sign deliveries a tenant would trust).

Sealed with Fernet (AES-128-CBC with HMAC-SHA256, from `cryptography`) under a
key derived (HKDF-SHA256) from CHORUS_SECRET_KEY; values sealed under a former
key still open while it is listed in CHORUS_SECRET_KEY_FALLBACKS (Django's own
rotation setting, which sessions and signed links follow too), and are sealed
afresh under the current key when next written, or by `manage.py reseal_secrets`
(`reseal`), after which the former key can be dropped.
"""

from __future__ import annotations

import base64
import functools

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings


class SealBroken(Exception):
    """A sealed value that no configured key opens."""


_NO_KEY_OPENS = (
    "sealed under a key that is neither CHORUS_SECRET_KEY nor one of CHORUS_SECRET_KEY_FALLBACKS"
)


def seal(value: str) -> str:
    return _box(_keys()).encrypt(value.encode()).decode("ascii")


def unseal(sealed: str) -> str:
    try:
        return _box(_keys()).decrypt(sealed.encode("ascii")).decode()
    except (InvalidToken, ValueError):
        raise SealBroken(_NO_KEY_OPENS) from None


def reseal(sealed: str) -> str | None:
    """The value sealed afresh under the current key; None when it already is.
    SealBroken when no configured key opens it."""
    try:
        _box(_keys()[:1]).decrypt(sealed.encode("ascii"))
        return None
    except (InvalidToken, ValueError):
        pass
    try:
        return _box(_keys()).rotate(sealed.encode("ascii")).decode("ascii")
    except (InvalidToken, ValueError):
        raise SealBroken(_NO_KEY_OPENS) from None


def _keys() -> tuple[str, ...]:
    return (settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS)


@functools.cache
def _box(secret_keys: tuple[str, ...]) -> MultiFernet:
    """The first key seals; every key opens. Cached per key list (a derivation
    costs more than the sealing itself)."""
    return MultiFernet([_fernet(secret_key) for secret_key in secret_keys])


def _fernet(secret_key: str) -> Fernet:
    derived = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=None, info=b"chorus sealed values v1"
    ).derive(secret_key.encode())
    return Fernet(base64.urlsafe_b64encode(derived))
