"""When a realtime session's text is spoken: sentence by sentence, cut at a word
when a sentence runs past the schedule, everything on a flush."""

from __future__ import annotations

import pytest

from synthesis.realtime.schedule import DEFAULT_SCHEDULE, next_unit, sentence_end, speakable


@pytest.mark.parametrize(
    ("text", "end"),
    [
        ("Hello there. How are", len("Hello there.")),
        ("One. Two! Three? Four", len("One. Two! Three?")),
        ('He said "stop." Then', len('He said "stop."')),
        ("It ends here.", len("It ends here.")),
        ("Ask Dr. Smith", 0),
        ("It costs 3.", 0),  # 3.5 may follow
        ("Call J. Doe", 0),
        ("no end yet", 0),
        ("\u4f60\u597d\u3002\u518d", 3),  # a CJK full stop needs no space after it
    ],
)
def test_a_sentence_ends_at_terminal_punctuation_but_not_at_an_abbreviation_or_a_number(
    text: str, end: int
) -> None:
    assert sentence_end(text) == end


def test_complete_sentences_go_together_and_the_rest_waits() -> None:
    assert next_unit("One. Two. Thr", turn=3, flush=False) == ("One. Two.", " Thr")


def test_a_sentence_that_runs_past_the_schedule_is_cut_at_a_word() -> None:
    first = DEFAULT_SCHEDULE[0]
    words = "word " * (first // 5 + 2)
    unit, rest = next_unit(words, turn=0, flush=False)
    assert 0 < len(unit) <= first
    assert rest.startswith(" ")  # cut between words
    assert unit + rest == words
    # Later turns wait for longer units.
    assert next_unit(words, turn=1, flush=False) == ("", words)


def test_a_flush_speaks_whatever_is_there() -> None:
    assert next_unit("half a senten", turn=0, flush=True) == ("half a senten", "")
    assert next_unit("half a senten", turn=0, flush=False) == ("", "half a senten")


def test_punctuation_alone_is_not_spoken() -> None:
    assert not speakable(" ... ")
    assert speakable("ok")
