"""What the admin pages show, gathered from the core (no Flask here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from think_jobs import Think
from think_jobs.results import StreamEvent
from think_jobs.streaming import buffered_events


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
    jobs = agent.jobs
    for event in buffered_events(jobs.redis, jobs.keys, agent.address, request_id):
        found.add(event)
    return found


def duration(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None:
        return ""
    seconds = (end - start).total_seconds()
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
