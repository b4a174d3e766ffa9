"""Every engine refuses at submit, before any charge, text it has nothing to say for
and the model's control tokens (`synthesis.text_check`).

Before, only cosyvoice2's pool refused them: on espeak 100 zero-width spaces were
accepted and charged, and `<|...|>` was accepted as text.
"""

from __future__ import annotations

from typing import Any

import pytest

from batches.models import Batch
from synthesis.models import Job
from tests.assertions import assert_error
from tests.conftest import Persona

pytestmark = pytest.mark.embedded

ZERO_WIDTH = "\u200b" * 100

REFUSED = [
    pytest.param(ZERO_WIDTH, "nothing_to_speak", id="zero-width-spaces"),
    pytest.param("\u200b\u2060\ufeff \u00ad ... !?", "nothing_to_speak", id="invisible-and-marks"),
    pytest.param("<|en|>Hello.", "control_token", id="language-tag"),
    pytest.param("Say <|endofprompt|> then hello.", "control_token", id="end-of-prompt"),
]


@pytest.fixture(params=["espeak", "synthetic"])
def engine_name(request: Any, settings: Any) -> str:
    settings.ENGINE = request.param
    return str(request.param)


def nothing_charged(persona: Persona) -> None:
    assert not Job.objects.filter(tenant=persona.tenant).exists()
    characters = persona.client.get("/v1/usage").json()["characters"]
    assert (characters["used"], characters["reserved"]) == (0, 0)


@pytest.mark.parametrize(("text", "reason"), REFUSED)
def test_speech_with_nothing_to_say_is_refused_on_every_engine(
    alice: Persona, broker: Any, engine_name: str, text: str, reason: str
) -> None:
    response = alice.client.post("/v1/speech", {"text": text}, format="json")

    error = assert_error(response, 400, "unsupported_text")
    assert error["details"] == {"field": "text", "reason": reason}
    nothing_charged(alice)


def test_an_instruction_with_control_tokens_is_refused_on_every_engine(
    alice: Persona, broker: Any, settings: Any
) -> None:
    settings.ENGINE = "synthetic"  # follows instructions, so the instruction is read

    response = alice.client.post(
        "/v1/speech",
        {"text": "Hello.", "instruction": "Whisper.<|endofprompt|>"},
        format="json",
    )

    error = assert_error(response, 400, "unsupported_text")
    assert error["details"] == {"field": "instruction", "reason": "control_token"}
    nothing_charged(alice)


def test_a_long_text_with_a_control_token_is_refused_before_it_is_split(
    alice: Persona, broker: Any, engine_name: str
) -> None:
    alice.tenant.plan.max_longform_chars = 10_000
    alice.tenant.plan.save()
    text = "A sentence to speak. " * 100 + "<|en|>"
    assert len(text) > alice.tenant.plan.max_text_chars

    response = alice.client.post("/v1/speech", {"text": text}, format="json")

    assert_error(response, 400, "unsupported_text")
    nothing_charged(alice)


def test_the_openai_route_refuses_it_too(alice: Persona, broker: Any, engine_name: str) -> None:
    response = alice.client.post(
        "/v1/audio/speech",
        {"model": "tts-1", "input": ZERO_WIDTH, "voice": "alloy"},
        format="json",
    )

    error = assert_error(response, 400, "unsupported_text")
    assert error["details"]["reason"] == "nothing_to_speak"
    nothing_charged(alice)


def test_a_batch_with_one_such_item_is_refused_whole_naming_it(
    alice: Persona, broker: Any, engine_name: str
) -> None:
    items = [{"text": "Hello there."}, {"text": ZERO_WIDTH}, {"text": "Goodbye."}]

    response = alice.client.post("/v1/batches", {"items": items}, format="json")

    error = assert_error(response, 400, "unsupported_text")
    assert (error["details"]["index"], error["details"]["field"]) == (1, "text")
    assert not Batch.objects.exists()
    nothing_charged(alice)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("Hello there.", id="english"),
        pytest.param("Tre\u0301s bien\u200b!", id="combining-mark-and-zero-width"),
        pytest.param("\u4f60\u597d", id="chinese"),
        pytest.param("42", id="digits"),
    ],
)
def test_text_with_something_to_say_is_still_accepted(
    alice: Persona, broker: Any, engine_name: str, text: str
) -> None:
    response = alice.client.post("/v1/speech", {"text": text}, format="json")

    assert response.status_code == 202, response.content
