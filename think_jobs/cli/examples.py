"""The example agents the demo runs (``think-jobs demo``); also a worker app:
``think-jobs worker --app think_jobs.cli.examples:jobs``.

All of them use the deterministic ``ScriptedModel``, so the demo needs no API key.
"""

from __future__ import annotations

import json
from typing import Any

from think_jobs.agent import Think
from think_jobs.models import EchoModel, Reply, ScriptedModel, ToolCall
from think_jobs.runtime import ThinkJobs
from think_jobs.scheduled_task import ScheduledTask
from think_jobs.tools import Tool, tool


class SupportDesk(Think):
    """Receives webhook events and acknowledges them."""

    def get_system_prompt(self) -> str:
        return "You triage support tickets."

    def get_model(self) -> EchoModel:
        return EchoModel(prefix="Ticket received, we are on it: ")


class Researcher(Think):
    """The child: answers research questions."""

    def get_system_prompt(self) -> str:
        return "You are a research assistant. Analyze data and report findings."

    def get_model(self) -> ScriptedModel:
        return ScriptedModel(
            Reply(text="Findings: weekly signups grew 12% and churn fell to 2.1%.", delay_s=0.02)
        )


class Lead(Think):
    """The parent: delegates research to a child agent through a tool."""

    def get_model(self) -> ScriptedModel:
        return ScriptedModel(
            Reply(
                text="Let me ask the research team. ",
                tool_calls=[ToolCall("research", {"question": "How did the week go?"})],
                then=Reply(text="Summary: a good week, growth up and churn down."),
            )
        )

    def get_tools(self) -> dict[str, Tool]:
        @tool
        def research(question: str) -> str:
            """Ask the Researcher child agent and return its answer."""
            parts: list[str] = []

            class Collect:
                def on_event(self, json_chunk: str) -> None:
                    chunk: dict[str, Any] = json.loads(json_chunk)
                    if chunk["type"] == "text-delta":
                        parts.append(chunk["delta"])

            self.sub_agent(Researcher, f"{self.name}-research").chat(question, Collect())
            return "".join(parts)

        return {"research": research}


class Storyteller(Think):
    """Streams slowly: the demo cancels one of its turns half-way."""

    def get_model(self) -> ScriptedModel:
        story = " ".join(["Once upon a time, in a queue far away, a turn waited."] * 20)
        return ScriptedModel(Reply(text=story, delay_s=0.03))


class Reporter(Think):
    """Writes a daily report at 09:00 UTC (and on demand)."""

    def get_scheduled_tasks(self) -> dict[str, ScheduledTask]:
        return {
            "daily-report": ScheduledTask(
                "every day at 09:00", timezone="UTC", prompt="Generate the daily report."
            )
        }

    def get_model(self) -> ScriptedModel:
        return ScriptedModel("Daily report: 42 tickets closed, 3 open, no incidents.")


EXAMPLE_AGENTS: tuple[type[Think], ...] = (SupportDesk, Researcher, Lead, Storyteller, Reporter)


def register_examples(jobs: ThinkJobs) -> ThinkJobs:
    for cls in EXAMPLE_AGENTS:
        jobs.register(cls)
    return jobs


jobs = register_examples(ThinkJobs())
