"""When a session's text is spoken: in units, as it arrives.

An engine that takes whole texts (espeak, synthetic, and cosyvoice2 outside its
text-stream mode) speaks a session sentence by sentence: a unit goes to the
engine as soon as a sentence is complete, so the first audio follows the first
sentence's last word. A sentence that runs long without ending is cut at a word
once the buffer reaches the schedule's length for the unit's turn, as
ElevenLabs' `chunk_length_schedule` does: a short first unit (the first audio
comes sooner), longer ones after it (fewer seams, better prosody). A flush
speaks whatever is there, mid-sentence or not.
"""

from __future__ import annotations

import re

# Characters of text without a sentence end after which the unit is cut at a
# word, by the unit's turn (the last one repeats).
DEFAULT_SCHEDULE = (60, 120, 200, 260)

# A sentence ends at terminal punctuation (and any closing quotes or brackets)
# followed by white space or the end of what has arrived; CJK full stops need no
# space after them.
_END = re.compile(r"(?:[.!?\u2026]+[\"'\u201d\u2019)\]]*(?=\s|$)|[\u3002\uff01\uff1f]+)")
# A full stop that rarely ends a sentence: a title or common abbreviation, a
# single initial, or a number's point (`3.` may be followed by `5`).
_NOT_AN_END = re.compile(r"(?:\b(?:Mr|Mrs|Ms|Dr|Prof|St|vs|etc|e\.g|i\.e|No)|\b[A-Z]|\d)\.$")


def sentence_end(text: str) -> int:
    """The end of the last complete sentence in `text` (0: none yet)."""
    end = 0
    for match in _END.finditer(text):
        if match.group().startswith(".") and _NOT_AN_END.search(text[: match.start() + 1]):
            continue
        end = match.end()
    return end


def next_unit(
    buffer: str, *, turn: int, flush: bool, schedule: tuple[int, ...] = DEFAULT_SCHEDULE
) -> tuple[str, str]:
    """(what to speak now, what waits): the unit is empty when nothing is ready.
    `turn` counts the units already spoken in this context."""
    if flush:
        return buffer, ""
    end = sentence_end(buffer)
    if end:
        return buffer[:end], buffer[end:]
    limit = schedule[min(turn, len(schedule) - 1)]
    if len(buffer) < limit:
        return "", buffer
    cut = buffer.rfind(" ", 0, limit)
    cut = cut if cut > 0 else limit
    return buffer[:cut], buffer[cut:]


def speakable(unit: str) -> bool:
    """Whether a unit has anything an engine can say (punctuation alone has not)."""
    return any(ch.isalnum() for ch in unit)
