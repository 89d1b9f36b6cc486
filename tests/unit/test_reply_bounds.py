"""``ReplyBounds``: a reply never grows past ``max_message_bytes`` or ``max_parts_per_message``,
and one far from them is serialized once, not per chunk."""

from __future__ import annotations

from typing import Any

import pytest

from think_jobs.assembly import MessageAssembler
from think_jobs.chunks import (
    AbortChunk,
    Chunk,
    DataChunk,
    FinishChunk,
    FinishStepChunk,
    StartChunk,
    StartStepChunk,
    TextDeltaChunk,
    TextStartChunk,
    parse_chunk,
)
from think_jobs.engine.reply_bounds import ReplyBounds, ReplyTooLarge
from think_jobs.messages import message_bytes


class Reply:
    """A real assembler behind the bounds, counting how often the reply is serialized."""

    def __init__(self, max_bytes: int = 10_000, max_parts: int = 1000) -> None:
        self.assembler = MessageAssembler("m1")
        self.measured = 0
        self.bounds = ReplyBounds(
            max_bytes, max_parts, measure=self._measure, parts=lambda: self.assembler.part_count
        )

    def _measure(self) -> int:
        self.measured += 1
        return message_bytes(self.assembler.message)

    def add(self, chunk: Chunk | dict[str, Any]) -> None:
        parsed = chunk if not isinstance(chunk, dict) else parse_chunk(chunk)
        self.bounds.admit(parsed)
        self.assembler.feed(parsed)

    @property
    def size(self) -> int:
        return message_bytes(self.assembler.message)


def opened(reply: Reply) -> Reply:
    for chunk in (StartChunk(message_id="m1"), StartStepChunk(), TextStartChunk(id="t")):
        reply.add(chunk)
    return reply


@pytest.mark.parametrize("text", ["a", "\u00e9", "\U0001f600", "\x01", '"'])
def test_text_streams_up_to_the_limit_and_no_further(text: str) -> None:
    """Whatever the characters (ASCII, two, four bytes, an escape), the reply stops within
    the limit and is refused the chunk that could take it past, naming the setting."""
    reply = opened(Reply(max_bytes=10_000))
    with pytest.raises(ReplyTooLarge) as refused:
        for _ in range(100_000):
            reply.add(TextDeltaChunk(id="t", delta=text * 7))
    assert reply.size <= 10_000
    assert (
        "a text-delta chunk could take it past the limit of 10000 (THINK_JOBS_MAX_MESSAGE_BYTES)"
        in str(refused.value)
    )


def test_ascii_text_fills_most_of_the_room_before_it_is_refused() -> None:
    reply = opened(Reply(max_bytes=100_000))
    with pytest.raises(ReplyTooLarge):
        for _ in range(100_000):
            reply.add(TextDeltaChunk(id="t", delta="word "))
    assert 99_000 < reply.size <= 100_000


def test_a_reply_far_from_the_limit_is_serialized_once() -> None:
    reply = opened(Reply(max_bytes=4 * 1024 * 1024))
    for _ in range(5000):
        reply.add(TextDeltaChunk(id="t", delta="token "))
    reply.add(FinishStepChunk())
    assert reply.measured == 1


def test_one_approaching_the_limit_is_serialized_a_few_dozen_times() -> None:
    reply = opened(Reply(max_bytes=1024 * 1024))
    with pytest.raises(ReplyTooLarge):
        for _ in range(1_000_000):
            reply.add(TextDeltaChunk(id="t", delta="tokens "))
    assert reply.measured < 100


def test_a_part_past_max_parts_is_refused() -> None:
    reply = Reply(max_parts=3)
    reply.add(StartStepChunk())
    reply.add(DataChunk(type="data-x", data=1))
    reply.add(DataChunk(type="data-y", data=2))
    with pytest.raises(
        ReplyTooLarge,
        match=r"has 3 parts and a data-z chunk would add one past the limit of 3 ",
    ):
        reply.add(DataChunk(type="data-z", data=3))
    assert reply.assembler.part_count == 3


def test_metadata_on_a_framing_chunk_counts() -> None:
    """A ``text-start`` is small, unless it carries provider metadata: then its JSON counts."""
    reply = Reply(max_bytes=5_000)
    reply.add(StartStepChunk())
    heavy = {"type": "text-start", "id": "t", "providerMetadata": {"p": {"k": "x" * 6000}}}
    with pytest.raises(ReplyTooLarge):
        reply.add(heavy)
    assert reply.assembler.part_count == 1


def test_a_bare_finish_or_abort_is_never_refused() -> None:
    """They add nothing, and the runner sends them after the reply is at its limit."""
    reply = opened(Reply(max_bytes=2_000))
    with pytest.raises(ReplyTooLarge):
        for _ in range(10_000):
            reply.add(TextDeltaChunk(id="t", delta="x"))
    measured = reply.measured
    reply.bounds.admit(FinishChunk())
    reply.bounds.admit(AbortChunk())
    assert reply.measured == measured


def test_a_continuation_counts_the_partial_it_starts_from() -> None:
    """The bounds measure the reply as it starts, stored partial included."""
    first = opened(Reply(max_bytes=10_000))
    first.add(TextDeltaChunk(id="t", delta="y" * 9000))
    partial = first.assembler.message
    reply = Reply(max_bytes=10_000)
    reply.assembler = MessageAssembler("m1", parts=partial.parts)
    for chunk in (StartChunk(message_id="m1"), StartStepChunk(), TextStartChunk(id="u")):
        reply.add(chunk)
    with pytest.raises(ReplyTooLarge):
        reply.add(TextDeltaChunk(id="u", delta="z" * 1000))
    reply.add(TextDeltaChunk(id="u", delta="z" * 100))


def test_one_large_chunk_that_fits_is_taken() -> None:
    """The bound of six bytes a character is only the quick answer: a chunk it refuses is
    measured as it would be stored before it is refused."""
    reply = opened(Reply(max_bytes=10_000))
    reply.add(TextDeltaChunk(id="t", delta="y" * 9_500))
    assert 9_500 < reply.size <= 10_000
