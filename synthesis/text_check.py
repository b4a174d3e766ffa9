"""What any engine is given to speak, checked at submit for every engine.

`synthesis.services.jobs` calls `speech_text_check` for every submit (a single
job, a long text, each item of a batch, the OpenAI-compatible route) before
anything is charged; the cosyvoice2 engine calls the same checks again before
touching its model. A text with nothing to say was accepted and charged on
espeak, and its audio was silence (or nothing at all).

Why each rule:
- `<|` ... `|>` is how CosyVoice2's control tokens (`<|endofprompt|>`, language
  tags) are written, and in text it makes upstream skip its normalization and
  sentence splitting: a tenant could steer the prompt. Refused on every engine,
  so a request does not change meaning with the pool that serves it.
- Text with no letter or digit (only punctuation, symbols, spaces, or invisible
  format characters such as zero-width spaces) gives no speech: CosyVoice2 drops
  punctuation-only segments and yields nothing, espeak speaks silence.
"""

from __future__ import annotations

import unicodedata

from chorus.errors import UnsupportedText


def has_control_token(text: str) -> bool:
    # Upstream's own test is looser: both markers anywhere, in any order.
    return "<|" in text and "|>" in text


def is_speakable(text: str) -> bool:
    """At least one letter or digit (any script): something an engine can say."""
    return any(unicodedata.category(char)[0] in "LN" for char in text)


def check_text(text: str) -> None:
    if not text.strip():
        raise UnsupportedText("Text is empty.", details={"field": "text", "reason": "empty"})
    if has_control_token(text):
        raise UnsupportedText(
            "Text may not contain '<|' ... '|>': those are a speech model's control tokens.",
            details={"field": "text", "reason": "control_token"},
        )
    if not is_speakable(text):
        raise UnsupportedText(
            "Text has no letter or digit to speak (only punctuation, symbols, spaces or "
            "invisible characters).",
            details={"field": "text", "reason": "nothing_to_speak"},
        )


def check_instruction(instruction: str) -> None:
    if has_control_token(instruction):
        raise UnsupportedText(
            "The instruction may not contain '<|' ... '|>': those are a speech model's "
            "control tokens (the service adds the one CosyVoice2 needs).",
            details={"field": "instruction", "reason": "control_token"},
        )


def speech_text_check(*, text: str, instruction: str) -> None:
    """Refuse text and instruction no engine should be given (`unsupported_text`)."""
    check_text(text)
    check_instruction(instruction)
