"""What CosyVoice2 accepts as text and instruction, checked without torch or upstream.

The web tier calls `cosyvoice2_check_request` at submit (when the workers run
cosyvoice2), and the engine calls the same checks before touching the model, so a
request upstream cannot serve is refused with a clear code instead of failing on a
worker after its quota was reserved.

Why each rule:
- `<|` ... `|>` in text makes upstream skip its text normalization and sentence
  splitting for the whole request, and such spans are the model's control tokens
  (`<|endofprompt|>`, language tags): a tenant could steer the prompt. Refused.
- Text with no letter or digit (only punctuation, symbols, spaces) gives no audio:
  upstream drops punctuation-only segments and yields nothing.
- CosyVoice2's instruct prompt ends with `<|endofprompt|>`; upstream's examples
  always add it and the code does not check. `instruct_prompt` adds it.
"""

from __future__ import annotations

import unicodedata

from chorus.errors import UnsupportedText, VoiceRequired

END_OF_PROMPT = "<|endofprompt|>"


def has_control_token(text: str) -> bool:
    # Upstream's own test is looser: both markers anywhere, in any order.
    return "<|" in text and "|>" in text


def is_speakable(text: str) -> bool:
    """At least one letter or digit (any script): something the model can say."""
    return any(unicodedata.category(char)[0] in "LN" for char in text)


def check_text(text: str) -> None:
    if not text.strip():
        raise UnsupportedText("Text is empty.", details={"field": "text", "reason": "empty"})
    if has_control_token(text):
        raise UnsupportedText(
            "Text may not contain '<|' ... '|>': those are the model's control tokens.",
            details={"field": "text", "reason": "control_token"},
        )
    if not is_speakable(text):
        raise UnsupportedText(
            "Text has no letter or digit to speak (only punctuation, symbols or spaces).",
            details={"field": "text", "reason": "nothing_to_speak"},
        )


def check_instruction(instruction: str) -> None:
    if has_control_token(instruction):
        raise UnsupportedText(
            "The instruction may not contain '<|' ... '|>': those are the model's control "
            "tokens (the service adds the one CosyVoice2 needs).",
            details={"field": "instruction", "reason": "control_token"},
        )


def instruct_prompt(instruction: str) -> str:
    """The instruction as CosyVoice2 was trained to read it: ending in <|endofprompt|>."""
    return f"{instruction.strip()}{END_OF_PROMPT}"


def cosyvoice2_check_request(*, text: str, has_voice: bool, instruction: str) -> None:
    """Refuse at submit what a cosyvoice2 worker would fail on."""
    if not has_voice:
        raise VoiceRequired(
            "The cosyvoice2 engine clones a voice: create a voice from reference audio and "
            "pass its id.",
            details={"engine": "cosyvoice2", "field": "voice_id"},
        )
    check_text(text)
    check_instruction(instruction)
