"""What CosyVoice2 accepts as a request, checked without torch or upstream.

The web tier calls `cosyvoice2_check_request` at submit (when the workers run
cosyvoice2), and the engine calls the same checks before touching the model, so a
request upstream cannot serve is refused with a clear code instead of failing on a
worker after its quota was reserved. Text and instruction are checked for every
engine (`synthesis.text_check`, why each rule); CosyVoice2 also needs a voice.

CosyVoice2's instruct prompt ends with `<|endofprompt|>`; upstream's examples
always add it and the code does not check. `instruct_prompt` adds it.
"""

from __future__ import annotations

from chorus.errors import VoiceRequired
from synthesis.text_check import check_instruction, check_text

__all__ = ["check_instruction", "check_text", "cosyvoice2_check_request", "instruct_prompt"]

END_OF_PROMPT = "<|endofprompt|>"


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
