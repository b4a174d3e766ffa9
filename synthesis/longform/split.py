"""Splitting a long text into segments an engine speaks in one call.

Sentences come from pysbd (rule-based, per language: abbreviations such as
"Dr." and "e.g." and decimals do not end a sentence). A sentence longer than a
segment is cut at clause marks, then between words, then between characters.
Every segment carries the span of the original text it stands for, whitespace
included, so the spans add up to the whole text: that is what cancel refunds
and what the job was charged for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import pysbd

# Languages whose rules pysbd has and we test; anything else splits as English.
LANGUAGES = ("en", "zh", "ja")
# Languages written without spaces between words: pieces join with nothing.
_UNSPACED = ("zh", "ja")

# Between segments (which end on sentence boundaries), in the joined file and in
# a stream alike: a pause, as a reader takes.
PAUSE_S = 0.12

_KANA = re.compile(r"[\u3040-\u30ff]")
_HAN = re.compile(r"[\u4e00-\u9fff]")
_CLAUSE_END = re.compile(r"(?<=[,;:\u3001\uff0c\uff1b\uff1a\u2014])")
_WORD_END = re.compile(r"(?<=\s)")


@dataclass(frozen=True)
class Segment:
    index: int
    text: str  # what the engine speaks (trimmed)
    start: int  # span in the original text: start and end offsets
    end: int

    @property
    def characters(self) -> int:
        return self.end - self.start


def detect_language(text: str) -> str:
    """A cheap guess from the first few thousand characters: kana means Japanese,
    Han characters Chinese, anything else English."""
    sample = text[:4000]
    if _KANA.search(sample):
        return "ja"
    han = len(_HAN.findall(sample))
    return "zh" if han and han * 4 >= len(sample.strip()) else "en"


def sentences(text: str, *, language: str, start: int = 0) -> list[tuple[int, str]]:
    """(offset, sentence) for the sentences of `text[start:]`, untrimmed and in order.

    pysbd's time grows faster than the text (1.1 s of CPU for 50,000 characters of
    English, 0.02 s for 5,000), so it reads blocks of about `BLOCK_CHARS`: every
    block's last sentence may be cut off by the block's end, so the next block
    starts again from it."""
    out: list[tuple[int, str]] = []
    offset = start
    size = BLOCK_CHARS
    while offset < len(text):
        block = text[offset : offset + size]
        found = [s for s in _segmenter(language).segment(block) if s]
        final = offset + len(block) >= len(text)
        if not final and len(found) < 2:
            size *= 2  # one sentence longer than the block: read further
            continue
        keep = found if final else found[:-1]
        position = 0
        for sentence in keep:
            at = block.find(sentence, position)
            position = (at if at >= 0 else position) + len(sentence)
            out.append((offset + position - len(sentence), sentence))
        if final:
            break
        offset += position
        size = BLOCK_CHARS
    return out


BLOCK_CHARS = 3000
# The first segment is found from this much of the text's start.
HEAD_CHARS = 2000


@lru_cache(maxsize=len(LANGUAGES))
def _segmenter(language: str) -> pysbd.Segmenter:
    return pysbd.Segmenter(language=language if language in LANGUAGES else "en", clean=False)


def split_text(
    text: str,
    *,
    language: str = "",
    max_chars: int = 250,
    first_max_chars: int | None = None,
    start: int = 0,
    first_index: int = 0,
) -> list[Segment]:
    """Segments of `text[start:]` (numbered from `first_index`), of at most
    `max_chars` each; the first at most `first_max_chars` (0: its first sentence
    alone, so a stream's first audio comes as soon as for a short text).

    Sentences are packed whole into segments; none is cut unless it alone is too
    long. Whitespace-only pieces are dropped (their characters go with the segment
    before, or the first one)."""
    language = language if language in LANGUAGES else detect_language(text)
    pieces = _pieces(text, language=language, max_chars=max_chars, start=start)
    glue = "" if language in _UNSPACED else " "
    groups: list[list[tuple[int, str]]] = []
    size = 0
    first_limit = max_chars if first_max_chars is None else first_max_chars
    for offset, piece in pieces:
        words = piece.strip()
        if not words:
            continue
        limit = first_limit if len(groups) == 1 else max_chars
        if groups and size + len(glue) + len(words) <= limit:
            groups[-1].append((offset, words))
            size += len(glue) + len(words)
        else:
            groups.append([(offset, words)])
            size = len(words)
    return _with_spans(groups, glue=glue, start=start, length=len(text), first_index=first_index)


def first_segment(text: str, *, language: str, max_chars: int) -> Segment:
    """Segment 0 of `split_text(..., first_max_chars=0)`, read from the text's
    start only: it can go to a worker before the rest is split."""
    head = text[:HEAD_CHARS]
    if len(head) == len(text):
        return split_text(text, language=language, max_chars=max_chars, first_max_chars=0)[0]
    pieces = [(o, p) for o, p in _pieces(head, language=language, max_chars=max_chars) if p.strip()]
    if not pieces:  # the head is blank: the whole text is one first segment's worth
        return split_text(text, language=language, max_chars=max_chars, first_max_chars=0)[0]
    offset, piece = pieces[0]
    end = pieces[1][0] if len(pieces) > 1 else offset + len(piece)
    return Segment(index=0, text=piece.strip(), start=0, end=end)


def _with_spans(
    groups: list[list[tuple[int, str]]], *, glue: str, start: int, length: int, first_index: int
) -> list[Segment]:
    segments = []
    for index, group in enumerate(groups):
        begin = start if index == 0 else group[0][0]
        end = groups[index + 1][0][0] if index + 1 < len(groups) else length
        text = glue.join(words for _, words in group)
        segments.append(Segment(index=first_index + index, text=text, start=begin, end=end))
    return segments


def _pieces(text: str, *, language: str, max_chars: int, start: int = 0) -> list[tuple[int, str]]:
    """(offset, piece) for every sentence, long ones cut to fit `max_chars`."""
    out: list[tuple[int, str]] = []
    for offset, sentence in sentences(text, language=language, start=start):
        out += _fit(sentence, offset, max_chars=max_chars)
    return out


def _fit(piece: str, start: int, *, max_chars: int) -> list[tuple[int, str]]:
    """`piece` cut at clause marks, then word gaps, then anywhere, into parts of
    at most `max_chars` (trimmed)."""
    if len(piece.strip()) <= max_chars:
        return [(start, piece)]
    for boundary in (_CLAUSE_END, _WORD_END):
        parts = [p for p in boundary.split(piece) if p]
        if len(parts) > 1:
            return _regroup(parts, start, max_chars=max_chars)
    return [(start + i, piece[i : i + max_chars]) for i in range(0, len(piece), max_chars)]


def _regroup(parts: list[str], start: int, *, max_chars: int) -> list[tuple[int, str]]:
    """Adjacent parts merged while they fit; a part too long alone is cut further."""
    out: list[tuple[int, str]] = []
    current, current_start, offset = "", start, start
    for part in parts:
        if current and len((current + part).strip()) > max_chars:
            out += _fit(current, current_start, max_chars=max_chars)
            current, current_start = "", offset
        current += part
        offset += len(part)
    if current:
        out += _fit(current, current_start, max_chars=max_chars)
    return out
