"""Picking up a turn whose previous attempt did not finish (SPEC §9).

The stream holds every chunk earlier attempts published, and the new attempt read it as it
took the stream over (so nothing stale can be added after), so the partial reply is rebuilt
from it exactly as a client saw it. If the stream already ends with ``finish`` (the executor
died after the model completed but before the database write), the reply is complete and no
model call is needed. If the stream is gone or could not be read (Redis lost its data, or was
unreachable), the partial stored in the database, if any, is used instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from think_jobs.assembly import MessageAssembler
from think_jobs.chunks import parse_chunk
from think_jobs.domain.records import TurnRecord
from think_jobs.messages import UIMessage
from think_jobs.results import StreamEvent

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recovered:
    """What the earlier attempts produced."""

    message: UIMessage
    finished: bool
    buffer_length: int
    from_stream: bool = True  # False: the stored partial (the stream held none, or was unread)

    @property
    def has_content(self) -> bool:
        return any(part.type != "step-start" for part in self.message.parts)


def recover(
    turn: TurnRecord,
    streamed: list[StreamEvent] | None,
    stored: UIMessage | None,
    *,
    seed: UIMessage | None = None,
) -> Recovered:
    """Rebuild the partial reply of ``turn`` from the events its stream held (None: it could
    not be read), else from ``stored``. ``seed``: the reply the stream extends (a tool
    approval's continuation streams only what it adds)."""
    message_id = turn.assistant_message_id or turn.request_id
    if streamed is None:
        log.warning("stream of %s unreadable; continuing from the stored partial", turn.request_id)
    events = streamed or []
    chunks = [event.chunk for event in events if event.chunk is not None]
    if not chunks:
        fallback = stored or UIMessage(id=message_id, role="assistant", parts=[])
        return Recovered(fallback, finished=False, buffer_length=len(events), from_stream=False)
    assembler = MessageAssembler(message_id, parts=seed.parts if seed is not None else None)
    finished = False
    for raw in chunks:
        chunk = parse_chunk(raw)
        if chunk.type in ("abort", "error"):
            continue
        assembler.feed(chunk)
        finished = chunk.type == "finish"
    return Recovered(assembler.message, finished, len(events))
