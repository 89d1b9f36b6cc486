"""``PairJoiner``: a surrogate pair a model split across two deltas becomes one character."""

from __future__ import annotations

from think_jobs.chunks import (
    ReasoningDeltaChunk,
    ReasoningEndChunk,
    TextDeltaChunk,
    TextEndChunk,
)
from think_jobs.engine.surrogates import PairJoiner
from think_jobs.limits import is_unicode, well_formed

SMILE = "\U0001f600"  # 😀 as UTF-16: \ud83d \ude00
HIGH, LOW = "\ud83d", "\ude00"


def text(delta: str, block: str = "t") -> TextDeltaChunk:
    return TextDeltaChunk(id=block, delta=delta)


def test_a_pair_split_between_two_deltas_becomes_one_character() -> None:
    joiner = PairJoiner()
    first = joiner.delta(text("smile " + HIGH))
    second = joiner.delta(text(LOW + " done"))
    assert first is not None and first.delta == "smile "
    assert second is not None and well_formed(second.delta) == SMILE + " done"


def test_a_delta_that_is_only_the_first_half_sends_nothing_until_the_second() -> None:
    joiner = PairJoiner()
    assert joiner.delta(text(HIGH)) is None
    joined = joiner.delta(text(LOW))
    assert joined is not None and well_formed(joined.delta) == SMILE


def test_a_delta_without_a_trailing_half_is_passed_on_as_it_is() -> None:
    joiner = PairJoiner()
    chunk = text("plain " + SMILE)
    assert joiner.delta(chunk) is chunk
    assert joiner.rest() == []


def test_a_half_left_when_its_block_ends_becomes_a_replacement_character() -> None:
    joiner = PairJoiner()
    assert joiner.delta(text("cut " + HIGH)) is not None
    assert joiner.ending(TextEndChunk(id="other")) is None  # another block's end
    replacement = joiner.ending(TextEndChunk(id="t"))
    assert replacement == TextDeltaChunk(id="t", delta="\ufffd")
    assert joiner.ending(TextEndChunk(id="t")) is None  # sent once
    assert joiner.rest() == []


def test_a_half_not_followed_by_its_other_half_stays_lone_and_is_mended() -> None:
    joiner = PairJoiner()
    joiner.delta(text("a" + HIGH))
    joined = joiner.delta(text("b"))
    assert joined is not None and joined.delta == HIGH + "b"
    assert not is_unicode(joined.delta) and well_formed(joined.delta) == "\ufffdb"


def test_blocks_hold_their_halves_apart() -> None:
    """A text block and a reasoning block of the same id, and two text blocks, interleaved."""
    joiner = PairJoiner()
    joiner.delta(text("x" + HIGH, "a"))
    joiner.delta(ReasoningDeltaChunk(id="a", delta="r" + "\ud83e"))
    joiner.delta(text("y" + HIGH, "b"))
    a = joiner.delta(text(LOW, "a"))
    reasoning = joiner.delta(ReasoningDeltaChunk(id="a", delta="\udd14"))
    assert a is not None and well_formed(a.delta) == SMILE
    assert isinstance(reasoning, ReasoningDeltaChunk)
    assert well_formed(reasoning.delta) == "\U0001f914"
    assert joiner.ending(ReasoningEndChunk(id="a")) is None
    assert joiner.rest() == [TextDeltaChunk(id="b", delta="\ufffd")]
    assert joiner.rest() == []
