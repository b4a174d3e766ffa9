"""Short-lived client tokens: how a browser opens a realtime session.

A browser's WebSocket cannot set an `Authorization` header, and an API key in a
URL would end up in logs and history. A server holding a key with
`speech:write` makes a token (`POST /v1/realtime/tokens`) and hands it to its
page, which connects with `?token=`. A token works once, for its tenant and the
key that made it, and expires after at most ten minutes. Only its hash is kept
(in Redis, with its expiry as the key's TTL).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from datetime import datetime, timedelta

from django.utils import timezone

from tenants.models import ApiKey

PREFIX = "crt_"
MAX_TTL_S = 600
DEFAULT_TTL_S = 300


def _key(raw: str) -> str:
    return "chorus:rt:token:" + hashlib.sha256(raw.encode()).hexdigest()


def token_create(*, client: object, api_key: ApiKey, ttl_s: int) -> tuple[str, datetime]:
    """A new token for `api_key`'s tenant, and when it expires."""
    raw = PREFIX + secrets.token_urlsafe(32)
    record = json.dumps({"key": api_key.pk, "tenant": api_key.tenant_id})
    client.set(_key(raw), record, ex=ttl_s)  # type: ignore[attr-defined]
    return raw, timezone.now() + timedelta(seconds=ttl_s)


async def token_redeem(*, client: object, raw: str) -> tuple[int, int] | None:
    """(API key id, tenant id) of a live token, which is used up; None if it is
    unknown, expired or used."""
    if not raw.startswith(PREFIX):
        return None
    record = await client.getdel(_key(raw))  # type: ignore[attr-defined]
    if record is None:
        return None
    data = json.loads(record)
    return int(data["key"]), int(data["tenant"])
