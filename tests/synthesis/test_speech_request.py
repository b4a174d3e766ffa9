"""The speech request value: built once, and the keys it makes match those made
before it existed (stored Idempotency-Keys, batches and reusable results).

The pinned hashes were computed by the code each method replaces
(`request_fingerprint` over `job_create`'s parts, `reuse_key_for`, and a batch's
`request_fingerprint(priority, *map(dataclasses.asdict, items))`)."""

from __future__ import annotations

import dataclasses
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from batches.services import ItemSpec, batch_fingerprint
from synthesis.models import Job
from synthesis.speech_request import SpeechRequest

pytestmark = [pytest.mark.embedded]

VOICE_ID = uuid.UUID("2f1c7a52-8a39-4c55-9a4e-0d6a3f0b9b11")
VOICE: Any = SimpleNamespace(id=VOICE_ID, version=3)

PLAIN = SpeechRequest(text="Hello there.")
EVERYTHING = SpeechRequest(
    text="Grüße, 世界!",
    voice_id=VOICE_ID,
    format="opus",
    sample_rate=48000,
    speed=1.25,
    instruction="Whisper it.",
    stream=True,
    reuse=False,
    language="ja",
)
INT_SPEED = SpeechRequest(text="Again.", speed=2, reuse=True, format="mp3")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WithAlignment(SpeechRequest):
    """A field added later, as the next one will be."""

    alignment: bool = False


@pytest.mark.parametrize(
    ("speech", "priority", "fingerprint"),
    [
        (PLAIN, "normal", "f9cd338beab9b3f87f8979eb3eede52a10cfb389e2ae7284c5609101f18533e7"),
        (EVERYTHING, "high", "133826e560f20bab205c89b42e2ed58432a52b9313600afff66d4cf80f71eaf8"),
        (INT_SPEED, "normal", "b3a53925ece0d7a7202b825318782160c591a5e27ab426058957fcea0595580f"),
    ],
)
def test_its_fingerprint_is_the_one_an_idempotency_key_stored_before(
    speech: SpeechRequest, priority: str, fingerprint: str
) -> None:
    assert speech.fingerprint(priority=priority) == fingerprint


@pytest.mark.parametrize(
    ("speech", "reuse_key"),
    [
        (PLAIN, "f7451957ad433ed52f40bfd00f77b2b5bfe4bf0d3378d8ea8721829d43e085d8"),
        (EVERYTHING, "55c2b7d8c46429ed24b75d4ff6a083435d0335b1c8aff90967b8296e59d5f33e"),
        (INT_SPEED, "53b2c44f0f8c7bc4a598cdb70488758e5422ec32fa017f9030ab7c10072e755a"),
    ],
)
def test_its_reuse_key_is_the_one_earlier_results_were_stored_under(
    speech: SpeechRequest, reuse_key: str
) -> None:
    voice = VOICE if speech.voice_id else None
    assert speech.reuse_key(tenant_id=7, engine="espeak", voice=voice) == reuse_key


def test_a_batchs_fingerprint_is_the_one_stored_before() -> None:
    items = [
        ItemSpec(speech=SpeechRequest(text="One.")),
        ItemSpec(
            speech=SpeechRequest(
                text="Two.",
                voice_id=VOICE_ID,
                format="flac",
                sample_rate=24000,
                speed=0.75,
                instruction="Slowly.",
                reuse=True,
            ),
            custom_id="c2",
            metadata={"n": 2, "tag": "é"},
        ),
    ]
    assert batch_fingerprint(priority="low", items=items) == (
        "391a8648f84abc502122e8883d5313928dbd11d314c6d371172c377afb2bc2b6"
    )
    assert batch_fingerprint(priority="high", items=items[:1]) == (
        "c71dc507fe7515fd26566855faa9de8546cfdd6ffacafb6330b445196550e42e"
    )


def test_what_changes_the_audio_changes_the_reuse_key_and_nothing_else_does() -> None:
    key = PLAIN.reuse_key(tenant_id=7, engine="espeak", voice=None)
    for change in ({"speed": 1.5}, {"instruction": "Softly."}, {"format": "mp3"}):
        assert (
            dataclasses.replace(PLAIN, **change).reuse_key(tenant_id=7, engine="espeak", voice=None)
            != key
        )
    for change in ({"stream": True}, {"reuse": True}, {"language": "en"}):
        assert (
            dataclasses.replace(PLAIN, **change).reuse_key(tenant_id=7, engine="espeak", voice=None)
            == key
        )
    assert PLAIN.reuse_key(tenant_id=8, engine="espeak", voice=None) != key


def test_a_field_added_later_keeps_every_key_made_without_it() -> None:
    before = WithAlignment(text="Hello there.")
    assert before.fingerprint(priority="normal") == PLAIN.fingerprint(priority="normal")
    assert before.reuse_key(tenant_id=7, engine="espeak", voice=None) == PLAIN.reuse_key(
        tenant_id=7, engine="espeak", voice=None
    )
    assert before.batch_item_fields() == PLAIN.batch_item_fields()


def test_a_field_added_later_tells_requests_apart_once_it_is_set() -> None:
    aligned = WithAlignment(text="Hello there.", alignment=True)
    assert aligned.fingerprint(priority="normal") != PLAIN.fingerprint(priority="normal")
    assert aligned.reuse_key(tenant_id=7, engine="espeak", voice=None) != PLAIN.reuse_key(
        tenant_id=7, engine="espeak", voice=None
    )
    assert aligned.batch_item_fields() != PLAIN.batch_item_fields()
    assert aligned.job_fields()["alignment"] is True


def test_it_takes_its_fields_from_a_serializers_data_and_leaves_the_rest() -> None:
    data = {
        "text": "Hi.",
        "voice_id": VOICE_ID,
        "priority": "high",
        "format": "mp3",
        "sample_rate": None,
        "speed": 1.0,
        "instruction": "",
        "stream": True,
        "reuse": None,
        "keep_on_disconnect": True,
        "language": "en",
    }
    assert SpeechRequest.from_data(data) == SpeechRequest(
        text="Hi.", voice_id=VOICE_ID, format="mp3", stream=True, language="en"
    )
    assert SpeechRequest.from_data({"text": "Defaults."}) == SpeechRequest(text="Defaults.")


def test_it_is_a_value_that_cannot_change() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        PLAIN.text = "Something else."  # type: ignore[misc]
    assert SpeechRequest(text="Hello there.") == PLAIN
    assert hash(SpeechRequest(text="Hello there.")) == hash(PLAIN)
    with pytest.raises(TypeError):
        SpeechRequest("Hello there.")  # type: ignore[misc]  # keyword-only


def test_a_jobs_row_gives_back_the_request_it_was_made_from() -> None:
    job = Job(**EVERYTHING.job_fields(), voice_id=VOICE_ID)
    assert job.requested_sample_rate == 48000
    assert job.characters == len(EVERYTHING.text)
    # `reuse` is a choice made at submit, not kept on the row.
    assert SpeechRequest.of_job(job) == dataclasses.replace(EVERYTHING, reuse=None)
