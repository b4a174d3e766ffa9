"""A voice's consent record, as the API takes it: a JSON object in the
multipart form's `consent` field, and an optional evidence recording beside it.

    consent={"speaker_name": "Alice Liddell", "method": "signed_form",
             "given_at": "2026-03-01T10:00:00Z"}
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from chorus.errors import InvalidInput
from synthesis.models import ConsentMethod


class VoiceConsentRequired(InvalidInput):
    """The tenant's plan requires a consent record for every new voice."""

    code = "voice_consent_required"


class InvalidConsent(InvalidInput):
    """The `consent` field is there but not a consent record; `details` says why."""

    code = "invalid_consent"


# A clock a little ahead of ours is not a consent from the future.
CLOCK_SKEW = timedelta(minutes=5)
_FIELDS = ("speaker_name", "method", "given_at")


@dataclass(frozen=True)
class Consent:
    speaker_name: str
    method: str
    given_at: datetime
    evidence: bytes | None = None


def consent_parse(raw: str, *, evidence: bytes | None = None) -> Consent:
    """The `consent` form field (a JSON object) as a Consent, or InvalidConsent."""
    try:
        value: Any = json.loads(raw)
    except ValueError:
        raise _invalid("consent is not JSON; send a JSON object as the field's value.") from None
    if not isinstance(value, dict):
        raise _invalid("consent is a JSON object with speaker_name, method and given_at.")
    unknown = sorted(set(value) - set(_FIELDS))
    missing = [name for name in _FIELDS if name not in value]
    if unknown or missing:
        raise _invalid(
            "consent has exactly speaker_name, method and given_at.",
            unknown=unknown,
            missing=missing,
        )
    speaker = value["speaker_name"]
    if not isinstance(speaker, str) or not speaker.strip() or len(speaker) > 200:
        raise _invalid("consent.speaker_name is the speaker's name, 1 to 200 characters.")
    method = value["method"]
    if method not in ConsentMethod.values:
        raise _invalid(
            f"consent.method is one of {', '.join(ConsentMethod.values)}.",
            known=list(ConsentMethod.values),
        )
    given_at = _instant(value["given_at"])
    if given_at > timezone.now() + CLOCK_SKEW:
        raise _invalid("consent.given_at is in the future.")
    return Consent(
        speaker_name=speaker.strip(), method=method, given_at=given_at, evidence=evidence
    )


def _instant(raw: object) -> datetime:
    at = None
    if isinstance(raw, str):
        try:
            at = parse_datetime(raw)
        except ValueError:
            at = None
    if at is None or at.tzinfo is None:
        raise _invalid(
            "consent.given_at is an ISO 8601 date-time with an offset, e.g. 2026-03-01T10:00:00Z."
        )
    return at


def _invalid(message: str, **details: Any) -> InvalidConsent:
    return InvalidConsent(message, details={"field": "consent", **details})
