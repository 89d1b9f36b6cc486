"""What the admin pages show, gathered from the core (no Flask here)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from think_jobs import Approval, Think
from think_jobs.errors import UnknownRequestError
from think_jobs.messages import message_text
from think_jobs.results import StreamEvent


@dataclass
class Transcript:
    """A turn's stream so far: the text, tool activity, errors, and how it ended."""

    text: str = ""
    reasoning: str = ""
    tools: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    last_seq: int = -1
    status: str | None = None
    error: str | None = None

    def add(self, event: StreamEvent) -> None:
        self.last_seq = event.seq
        if event.done:
            self.status, self.error = event.status, event.error
            return
        chunk = event.chunk or {}
        kind = chunk.get("type")
        if kind == "text-delta":
            self.text += str(chunk.get("delta", ""))
        elif kind == "reasoning-delta":
            self.reasoning += str(chunk.get("delta", ""))
        elif kind == "tool-input-available":
            self.tools.append(f"called {chunk.get('toolName')}")
        elif kind == "error":
            self.errors.append(str(chunk.get("errorText", "")))


def transcript(agent: Think, request_id: str) -> Transcript:
    found = Transcript()
    try:
        for event in agent.stream(request_id, live=False):
            found.add(event)
    except UnknownRequestError:
        pass
    return found


@dataclass(frozen=True)
class Asked:
    """One message a turn was asked to answer (what its submission carried)."""

    role: str
    text: str


def asked(agent: Think, request_id: str) -> list[Asked]:
    """The messages the turn's submission carried (empty for a blocking call's turn)."""
    return [
        Asked(message.role, message_text(message))
        for message in agent.submitted_messages(request_id)
    ]


@dataclass(frozen=True)
class AgentsPage:
    """One page of the agents table; ``pages`` counts them all (at least 1)."""

    rows: list[AgentRow]
    number: int
    pages: int
    total: int


class AgentRow(Protocol):
    """What the agents table reads of a row (the API's ``AgentSummary``)."""

    @property
    def agent_type(self) -> str: ...
    @property
    def agent_name(self) -> str: ...
    @property
    def pending(self) -> int: ...
    @property
    def running(self) -> int: ...


def agents_page(rows: Sequence[AgentRow], *, page: int, size: int) -> AgentsPage:
    """Page ``page`` (from 1) of ``rows``, the busiest (running, then pending) first."""
    ordered = sorted(rows, key=lambda r: (-r.running, -r.pending, r.agent_type, r.agent_name))
    pages = max(1, -(-len(ordered) // size))
    number = min(page, pages)
    start = (number - 1) * size
    return AgentsPage(list(ordered[start : start + size]), number, pages, len(ordered))


def duration(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None:
        return ""
    seconds = (end - start).total_seconds()
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def approvals_of(agent: Think, request_id: str) -> list[Approval]:
    """The tool approvals the request asked, or the ones it (a continuation) waits for."""
    return agent.list_approvals(request_id=request_id)
