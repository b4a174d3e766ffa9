"""Splitting long texts into segments: sentence ends per language, nothing lost."""
# ruff: noqa: RUF001 (full-width sentence marks are what these tests split at)

from __future__ import annotations

import itertools

import pytest

from synthesis.longform.split import Segment, detect_language, split_text


def _spans_cover(text: str, segments: list[Segment]) -> None:
    assert segments[0].start == 0
    assert segments[-1].end == len(text)
    for before, after in itertools.pairwise(segments):
        assert before.end == after.start
    assert sum(s.characters for s in segments) == len(text)


def test_it_splits_english_at_sentence_ends_not_at_abbreviations_or_decimals() -> None:
    text = "Dr. Smith paid 3.50 dollars, e.g. for a coffee. Then he left! Did he? Yes."
    segments = split_text(text, language="en", max_chars=60)
    assert [s.text for s in segments] == [
        "Dr. Smith paid 3.50 dollars, e.g. for a coffee.",
        "Then he left! Did he? Yes.",
    ]
    _spans_cover(text, segments)


def test_each_sentence_stays_whole_when_it_fits() -> None:
    text = "Dr. Smith arrived at 3.30 p.m. on Monday. It rained, e.g. all day. We left."
    segments = split_text(text, language="en", max_chars=45)
    assert [s.text for s in segments] == [
        "Dr. Smith arrived at 3.30 p.m. on Monday.",
        "It rained, e.g. all day. We left.",
    ]
    _spans_cover(text, segments)


def test_the_first_segment_is_the_first_sentence_alone() -> None:
    text = "Hello there. " + "This is the rest of it. " * 20
    segments = split_text(text, language="en", max_chars=200, first_max_chars=0)
    assert segments[0].text == "Hello there."
    assert all(len(s.text) <= 200 for s in segments)
    assert len(segments[1].text) > 150  # later sentences are packed together
    _spans_cover(text, segments)


def test_it_splits_chinese_at_full_width_sentence_marks() -> None:
    text = "我今天很高兴。你呢？我们去公园吧！好的"
    segments = split_text(text, language="zh", max_chars=8)
    assert [s.text for s in segments] == ["我今天很高兴。", "你呢？", "我们去公园吧！", "好的"]
    _spans_cover(text, segments)


def test_it_splits_japanese_and_joins_sentences_without_spaces() -> None:
    text = "今日はいい天気ですね。散歩に行きましょう！はい。"
    segments = split_text(text, language="ja", max_chars=30, first_max_chars=0)
    assert [s.text for s in segments] == ["今日はいい天気ですね。", "散歩に行きましょう！はい。"]
    _spans_cover(text, segments)


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("The weather is fine today. Let us go.", "en"),
        ("我今天很高兴。你呢？", "zh"),
        ("今日はいい天気ですね。", "ja"),
        ("漢字だけではなくひらがなもある。", "ja"),
    ],
)
def test_it_detects_the_language_from_the_script(text: str, language: str) -> None:
    assert detect_language(text) == language


def test_without_a_language_it_is_detected() -> None:
    text = "我今天很高兴。你呢？我们去公园吧！"
    assert [s.text for s in split_text(text, max_chars=8)] == [
        "我今天很高兴。",
        "你呢？",
        "我们去公园吧！",
    ]


def test_a_very_long_sentence_is_cut_at_clauses_then_words() -> None:
    clause = "and the river kept running past the old mill"
    text = ", ".join([clause] * 12) + "."
    segments = split_text(text, language="en", max_chars=100)
    assert len(segments) > 1
    assert all(len(s.text) <= 100 for s in segments)
    assert all(s.text.endswith((",", ".")) for s in segments)  # cut after a comma
    _spans_cover(text, segments)
    assert " ".join(s.text for s in segments).split() == text.split()


def test_text_without_punctuation_is_cut_between_words() -> None:
    text = " ".join(f"word{i}" for i in range(200))
    segments = split_text(text, language="en", max_chars=50)
    assert all(len(s.text) <= 50 for s in segments)
    assert " ".join(s.text for s in segments).split() == text.split()
    _spans_cover(text, segments)


def test_chinese_without_punctuation_is_cut_between_characters() -> None:
    text = "我" * 95
    segments = split_text(text, language="zh", max_chars=40)
    assert [len(s.text) for s in segments] == [40, 40, 15]
    _spans_cover(text, segments)


def test_whitespace_only_pieces_are_dropped_and_their_characters_kept() -> None:
    text = "First one.   \n\n   \t  Second one.  \n \n"
    segments = split_text(text, language="en", max_chars=12)
    assert [s.text for s in segments] == ["First one.", "Second one."]
    assert all(s.text.strip() for s in segments)
    _spans_cover(text, segments)
