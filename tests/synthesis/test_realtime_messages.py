"""A realtime client's messages: checked one by one, refused with stable codes."""

from __future__ import annotations

import json
import uuid

import pytest

from synthesis.realtime import messages as m


def test_a_session_start_takes_its_settings_and_defaults() -> None:
    voice = uuid.uuid4()
    start = m.parse(json.dumps({"type": "session.start", "voice_id": str(voice), "store": True}))
    assert isinstance(start, m.SessionStart)
    assert start.request.voice_id == voice
    assert (start.request.format, start.request.context, start.request.store) == (
        "pcm",
        m.DEFAULT_CONTEXT,
        True,
    )
    assert start.request.priority is None  # high where the plan allows it
    assert start.audio == "binary"


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("not json", "invalid_json"),
        ("[1]", "invalid_json"),
        ('{"type": "speak"}', "unknown_message_type"),
        ('{"type": "text.append"}', "invalid_request"),
        ('{"type": "text.append", "text": "hi", "voice": 1}', "unknown_field"),
        ('{"type": "session.start", "format": "flac"}', "unsupported_output"),
        ('{"type": "session.start", "voice_id": "nope"}', "invalid_request"),
        ('{"type": "session.start", "sample_rate": true}', "invalid_request"),
        ('{"type": "text.flush", "context_id": ""}', "invalid_request"),
        ('{"type": "session.start", "audio": "base64"}', "invalid_request"),
    ],
)
def test_a_bad_message_is_refused_with_its_code(raw: str, code: str) -> None:
    with pytest.raises(m.ProtocolError) as refused:
        m.parse(raw)
    assert refused.value.code == code
    assert 4400 <= refused.value.close_code < 4500


def test_an_oversized_message_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(m.ProtocolError) as refused:
        m.parse(json.dumps({"type": "text.append", "text": "x" * m.MAX_MESSAGE_BYTES}))
    assert (refused.value.code, refused.value.close_code) == ("message_too_large", 4413)
