"""Secrets and signatures, the Standard Webhooks way (its own library signs)."""

from __future__ import annotations

import base64
import secrets
from datetime import datetime

from standardwebhooks import Webhook

SECRET_PREFIX = "whsec_"


def secret_generate() -> str:
    """A new endpoint secret: `whsec_` and 32 random bytes in base64."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def signed_headers(*, secret: str, webhook_id: str, body: str, at: datetime) -> dict[str, str]:
    """The three headers a receiver verifies with `Webhook(secret).verify(body, headers)`.

    `at` is the attempt's time, not the event's: verifiers refuse a timestamp
    more than five minutes old, and a retry may go out hours after the event."""
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id=webhook_id, timestamp=at, data=body),
    }
