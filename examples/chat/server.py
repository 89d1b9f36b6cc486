"""The think-jobs side of the chat example: an agent whose scripted model answers word by word,
slowly enough to reload the page mid-reply, and the web app that serves the built page at
``/chat/`` next to think-jobs' API (``web.create_app``). Ask for a refund and the model calls
``refund``, a tool that needs a human's approval: the page shows Approve and Deny.

From the repository root, with Redis and a database as in the README, after
``scripts/build-chat-example`` (or ``npm ci && npm run build`` in ``examples/chat``)::

    export THINK_JOBS_SECRET_KEY=dev-secret THINK_JOBS_API_TOKENS=dev-token
    think-jobs worker --app examples.chat.server:jobs &
    python -m examples.chat.server --build ai7     # or ai6; then open the URL it prints
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from flask import Flask, Response, send_from_directory

import web
from think_jobs import ModelRequest, Think, ThinkJobs, tool
from think_jobs.messages import ToolPart, message_text
from think_jobs.models import Reply, ScriptedModel, ToolCall
from think_jobs.tools import Tool

HERE = Path(__file__).resolve().parent
BUILDS = ("ai7", "ai6")  # the current AI SDK major and the one before (vite.config.js)
FILLER = "This reply streams one word at a time, so you can reload the page while it arrives."
ASKING = "I can refund order A-17 once you approve."
REFUNDED = " Done: refunded order A-17."
NOT_REFUNDED = " OK, no refund."

jobs = ThinkJobs()


@jobs.register
class Chat(Think):
    """Answers every message, naming it, one word every ``delay_s`` seconds."""

    delay_s: ClassVar[float] = 0.15

    def get_model(self) -> ScriptedModel:
        return ScriptedModel(self.reply)

    def get_tools(self) -> dict[str, Tool]:
        @tool(needs_approval=True)
        def refund(order: str) -> str:
            """Refund an order (a human approves it first)."""
            return f"refunded {order}"

        return {"refund": refund}

    def reply(self, request: ModelRequest) -> Reply:
        question = last_question(request)
        if "refund" not in question.lower():
            return Reply(text=reply_to(question), delay_s=self.delay_s)
        after = Reply(text=after_refund(request), delay_s=self.delay_s)  # the step after the tool
        call = ToolCall("refund", {"order": "A-17"})
        return Reply(text=ASKING, delay_s=self.delay_s, tool_calls=[call], then=after)


def last_question(request: ModelRequest) -> str:
    asked = [message_text(m) for m in request.messages if m.role == "user"]
    return asked[-1] if asked else ""


def after_refund(request: ModelRequest) -> str:
    """What the model says once the human answered: the refund's outcome."""
    calls = [p for m in request.messages for p in m.parts if isinstance(p, ToolPart)]
    return REFUNDED if calls and calls[-1].state == "output-available" else NOT_REFUNDED


def reply_to(question: str) -> str:
    return f"You said “{question}”. {FILLER}"


def create_app(
    app_jobs: ThinkJobs = jobs, *, build: str = "ai7", config: Mapping[str, Any] | None = None
) -> Flask:
    """think-jobs' standalone app plus the page of ``build`` at ``/chat/``."""
    if build not in BUILDS:
        raise ValueError(f"build must be one of {BUILDS}, not {build!r}")
    dist = HERE / "dist" / build
    app = web.create_app(app_jobs, config)

    def page() -> Response:
        return send_from_directory(dist, "index.html")

    def asset(name: str) -> Response:
        return send_from_directory(dist / "assets", name)

    app.add_url_rule("/chat/", "chat_page", page)
    app.add_url_rule("/chat/assets/<path:name>", "chat_asset", asset)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", choices=BUILDS, default="ai7")
    parser.add_argument("--port", type=int, default=5000)
    options = parser.parse_args()
    jobs.migrate()
    app = create_app(build=options.build, config={"SESSION_COOKIE_SECURE": False})
    print(f"open http://127.0.0.1:{options.port}/chat/?agent=demo")
    app.run(port=options.port, threaded=True)


if __name__ == "__main__":
    main()
