"""The think-jobs side of the chat example: an agent whose scripted model answers word by word,
slowly enough to reload the page mid-reply, and the web app that serves the built page at
``/chat/`` next to think-jobs' API (``web.create_app``).

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
from think_jobs import ModelRequest, Think, ThinkJobs
from think_jobs.messages import message_text
from think_jobs.models import Reply, ScriptedModel

HERE = Path(__file__).resolve().parent
BUILDS = ("ai7", "ai6")  # the current AI SDK major and the one before (vite.config.js)
FILLER = "This reply streams one word at a time, so you can reload the page while it arrives."

jobs = ThinkJobs()


@jobs.register
class Chat(Think):
    """Answers every message, naming it, one word every ``delay_s`` seconds."""

    delay_s: ClassVar[float] = 0.15

    def get_model(self) -> ScriptedModel:
        return ScriptedModel(self.reply)

    def reply(self, request: ModelRequest) -> Reply:
        return Reply(text=reply_to(last_question(request)), delay_s=self.delay_s)


def last_question(request: ModelRequest) -> str:
    asked = [message_text(m) for m in request.messages if m.role == "user"]
    return asked[-1] if asked else ""


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
