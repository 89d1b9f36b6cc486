"""How big one reply may grow: the limits of an input message (``max_message_bytes`` as
compact UTF-8 JSON, ``max_parts_per_message``), checked before each chunk is added to it.

Why the reply obeys the input limits: what is stored must read back and be sent again (to
the model on the next turn, by ``chat()`` to a parent, by ``messages export``/``import``), and
a model or tool that streams without end must not fill the worker's memory or hold its agent
for good. A reply that would pass a limit stops there: the chunk is refused, the model's
stream is closed, and the turn ends as an error whose text names the limit.

Measuring the JSON on every chunk would cost a serialization per token, so this keeps a
bound instead. A chunk adds at most six bytes per character of its own (a JSON escape such
as ``\\u0001``; UTF-8 is at most four) plus a part's framing, so while the bounds added since
the last exact measure fit in the room it left, nothing is measured. The reply is measured
as its first chunk comes (a continuation starts from a stored partial) and again only when
the bounds run out of room: a reply far from the limit is measured once, and one that
approaches it a few dozen times, each time with less room left.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from think_jobs.chunks import (
    AbortChunk,
    Chunk,
    DataChunk,
    FileChunk,
    FinishChunk,
    FinishStepChunk,
    ReasoningDeltaChunk,
    ReasoningEndChunk,
    ReasoningStartChunk,
    SourceDocumentChunk,
    SourceUrlChunk,
    StartChunk,
    StartStepChunk,
    TextDeltaChunk,
    TextEndChunk,
    TextStartChunk,
    ToolInputAvailableChunk,
    ToolInputDeltaChunk,
    ToolInputErrorChunk,
    ToolInputStartChunk,
)

BYTES_PER_CHAR = 6  # the longest a character becomes in JSON: an escape such as \u0001
PART_BYTES = 512  # a part's framing beyond its chunk's own JSON (type, state, ids)
CLOSE_BYTES = 32  # closing a part changes its state ("streaming" to "done" and the like)

# Chunks that may add a part to the reply (the others grow or close one, or add nothing).
_OPENS_PART: frozenset[type[Chunk]] = frozenset(
    {
        StartStepChunk,
        TextStartChunk,
        ReasoningStartChunk,
        ToolInputStartChunk,
        ToolInputAvailableChunk,
        ToolInputErrorChunk,
        SourceUrlChunk,
        SourceDocumentChunk,
        FileChunk,
        DataChunk,
    }
)
# Chunks that carry nothing but their type and id: what each can add at most when bare.
_BARE_BOUND: dict[type[Chunk], int] = {
    StartStepChunk: PART_BYTES,
    TextStartChunk: PART_BYTES,
    ReasoningStartChunk: PART_BYTES,
    TextEndChunk: CLOSE_BYTES,
    ReasoningEndChunk: CLOSE_BYTES,
    FinishStepChunk: CLOSE_BYTES,
    StartChunk: 0,  # the message exists already
    FinishChunk: 0,
    AbortChunk: 0,
}
_BARE = frozenset({"type", "id"})


class ReplyTooLarge(Exception):
    """The next chunk would take the reply past a limit; the text names which."""


@dataclass
class ReplyBounds:
    """The limits of one reply, fed each chunk before the reply takes it.

    ``measure`` serializes the reply so far (bytes as compact UTF-8 JSON) and ``parts`` counts
    its parts; both read the reply the chunks are added to.
    """

    max_bytes: int
    max_parts: int
    measure: Callable[[], int]
    parts: Callable[[], int]
    _room: int | None = field(default=None, init=False)  # bytes left at the last measure
    _spent: int = field(default=0, init=False)  # bounds admitted since then

    def admit(self, chunk: Chunk) -> None:
        """Raises ``ReplyTooLarge`` if ``chunk`` could take the reply past a limit (a bare
        ``finish`` or ``abort`` never does: it adds nothing)."""
        kind = type(chunk)
        if kind in _OPENS_PART and (count := self.parts()) >= self.max_parts:
            raise ReplyTooLarge(
                f"the reply has {count} parts and a {chunk.type} chunk would add one past "
                f"the limit of {self.max_parts} (THINK_JOBS_MAX_PARTS_PER_MESSAGE)"
            )
        bound = _bound(chunk, kind)
        if bound == 0 or (self._room is not None and self._spent + bound <= self._room):
            self._spent += bound
            return
        size = self.measure()
        self._room, self._spent = self.max_bytes - size, 0
        if bound > self._room:
            bound = _tight_bound(chunk, kind)
        if bound > self._room:
            raise ReplyTooLarge(
                f"the reply is {size} bytes as JSON and a {chunk.type} chunk could take it past "
                f"the limit of {self.max_bytes} (THINK_JOBS_MAX_MESSAGE_BYTES)"
            )
        self._spent = bound


def _bound(chunk: Chunk, kind: type[Chunk]) -> int:
    """The most bytes ``chunk`` can add to the reply's JSON."""
    delta = _plain_delta(chunk, kind)
    if delta is not None:
        return BYTES_PER_CHAR * len(delta)
    if kind is ToolInputDeltaChunk:
        return BYTES_PER_CHAR * len(chunk.input_text_delta)  # type: ignore[union-attr]
    if kind in _BARE_BOUND and chunk.model_fields_set <= _BARE:
        return _BARE_BOUND[kind]
    return BYTES_PER_CHAR * len(chunk.model_dump_json(exclude_none=True)) + PART_BYTES


def _tight_bound(chunk: Chunk, kind: type[Chunk]) -> int:
    """``_bound`` made exact where that is cheap: a delta adds its text's JSON to a part's,
    escape for escape; any other chunk its own JSON's bytes and a part's framing (a partial
    tool input keeps its bound: it may re-serialize larger than its text)."""
    delta = _plain_delta(chunk, kind)
    if delta is not None:
        return len(json.dumps(delta, ensure_ascii=False).encode()) - 2  # without the quotes
    if kind is ToolInputDeltaChunk or kind in _BARE_BOUND:
        return _bound(chunk, kind)
    return len(chunk.model_dump_json(exclude_none=True).encode()) + PART_BYTES


def _plain_delta(chunk: Chunk, kind: type[Chunk]) -> str | None:
    """The text a text or reasoning delta appends, when it carries nothing more."""
    if (kind is TextDeltaChunk or kind is ReasoningDeltaChunk) and (
        chunk.provider_metadata is None  # type: ignore[union-attr]
    ):
        return chunk.delta  # type: ignore[union-attr]
    return None
