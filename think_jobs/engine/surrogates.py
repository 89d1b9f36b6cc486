"""Joins a surrogate pair a model split across two deltas of one text or reasoning block.

A model whose text comes as UTF-16 (a JavaScript server, a JSON ``\\ud83d`` escape ending one
event and ``\\ude00`` starting the next) may cut a character outside the Basic Multilingual
Plane between two deltas. Each half alone is a lone surrogate, which can be neither streamed
nor stored, and mended on its own each would become U+FFFD: an emoji turned into two
replacement characters. ``PairJoiner`` holds a high surrogate that ends a delta back until
the next delta of the same block, which then starts with it; whatever is held when the block
ends (or the model's stream does) goes out as U+FFFD, as a UTF-8 decoder treats a truncated
sequence. The common delta costs one comparison of its last character.
"""

from __future__ import annotations

from typing import TypeAlias

from think_jobs.chunks import (
    Chunk,
    ReasoningDeltaChunk,
    ReasoningEndChunk,
    TextDeltaChunk,
    TextEndChunk,
)

Delta: TypeAlias = TextDeltaChunk | ReasoningDeltaChunk
_Block = tuple[str, str]  # (the delta's type, the block's id)

_REPLACEMENT = "\ufffd"


def _is_high_surrogate(character: str) -> bool:
    return "\ud800" <= character <= "\udbff"


class PairJoiner:
    """Per model stream: ``delta()`` for each delta, ``ending()`` before each block's end,
    ``rest()`` when the stream ends."""

    def __init__(self) -> None:
        self._held: dict[_Block, str] = {}  # a block's trailing high surrogate

    def delta(self, chunk: Delta) -> Delta | None:
        """``chunk`` with a held high surrogate in front and its own trailing one held back;
        None when nothing is left to send (it was only that half)."""
        text = chunk.delta
        if not self._held:
            if not ("\ud800" <= text[-1:] <= "\udbff"):  # the common case: one comparison
                return chunk
        else:
            text = self._held.pop((chunk.type, chunk.id), "") + text
            if not text or not _is_high_surrogate(text[-1]):
                return chunk if text is chunk.delta else chunk.model_copy(update={"delta": text})
        self._held[(chunk.type, chunk.id)] = text[-1]
        text = text[:-1]
        return chunk.model_copy(update={"delta": text}) if text else None

    def ending(self, chunk: Chunk) -> Delta | None:
        """The delta of U+FFFD to send before ``chunk`` when it ends a block holding a half."""
        if not self._held:
            return None
        if isinstance(chunk, TextEndChunk):
            block: _Block = ("text-delta", chunk.id)
        elif isinstance(chunk, ReasoningEndChunk):
            block = ("reasoning-delta", chunk.id)
        else:
            return None
        if self._held.pop(block, None) is None:
            return None
        return _replacement(block)

    def rest(self) -> list[Delta]:
        """A delta of U+FFFD for each block still holding a half as the stream ends."""
        held, self._held = self._held, {}
        return [_replacement(block) for block in held]


def _replacement(block: _Block) -> Delta:
    kind, block_id = block
    if kind == "text-delta":
        return TextDeltaChunk(id=block_id, delta=_REPLACEMENT)
    return ReasoningDeltaChunk(id=block_id, delta=_REPLACEMENT)
