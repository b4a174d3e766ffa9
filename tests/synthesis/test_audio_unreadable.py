"""A file that is not audio is refused with libsndfile's reason, not a Python repr."""

from __future__ import annotations

from typing import Any

import pytest

from synthesis.audio import UnsupportedAudio, audio_duration, decode_reference


@pytest.mark.parametrize(
    "read", [audio_duration, lambda data: decode_reference(data, max_bytes=10_000_000)]
)
def test_a_text_file_is_refused_with_a_reason_a_person_can_read(read: Any) -> None:
    with pytest.raises(UnsupportedAudio) as refused:
        read(b"just some text, not audio at all\n" * 20)

    reason = refused.value.details["reason"]
    assert reason
    assert "BytesIO" not in reason, reason
    assert "0x" not in reason, reason
