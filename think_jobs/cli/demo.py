"""``think-jobs demo``: the example agents end to end on the embedded defaults.

A webhook delivered twice (one turn), a parent agent delegating to a child, a turn cancelled
half-way, and a scheduled prompt fired on demand; each streams to the terminal, then a summary
table. The turns run on a real Celery worker (threads pool) inside this process.

It uses ``THINK_JOBS_*`` settings (default: ``./think_jobs.db``) and, unless
``THINK_JOBS_REDIS_URL`` names one, a private ``redis-server`` on a free port that lives as long
as the run: the demo never writes into a Redis you already run, and leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import click

from think_jobs.agent import Think
from think_jobs.cli import examples
from think_jobs.cli.local_redis import masked, private_redis_server, reachable
from think_jobs.domain.status import Status
from think_jobs.runtime import ThinkJobs
from think_jobs.settings import load_settings
from think_jobs.testing import worker


@dataclass(frozen=True)
class Row:
    step: str
    agent: str
    request_id: str
    status: str
    note: str
    text: str


def run_demo(*, database_url: str | None = None) -> int:
    overrides = {"database_url": database_url} if database_url else {}
    settings = load_settings(**overrides)
    with _redis(settings.redis_url) as redis_url:
        jobs = ThinkJobs(settings.model_copy(update={"redis_url": redis_url}))
        examples.register_examples(jobs)
        jobs.migrate()
        click.secho(
            f"think-jobs demo — database {settings.database_url}, redis {redis_url}", bold=True
        )
        with worker(jobs, concurrency=SLOTS) as controller:
            where = f"Celery worker {controller.hostname} (threads pool, {SLOTS} slots)"
            click.echo(f"Turns run on a {where}, inside this process.")
            rows = [step(jobs) for step in STEPS]
        jobs.close()
    _print_summary(rows, where)
    return 0 if all(row.status in (Status.COMPLETED, Status.ABORTED) for row in rows) else 1


SLOTS = 4


@contextlib.contextmanager
def _redis(url: str) -> Iterator[str]:
    """The Redis named by THINK_JOBS_REDIS_URL (refused if it does not answer), else a
    private redis-server for this run only."""
    if "THINK_JOBS_REDIS_URL" in os.environ:
        if not reachable(url):
            raise click.ClickException(f"THINK_JOBS_REDIS_URL={masked(url)} does not answer")
        yield url
        return
    click.echo(
        "Starting a private redis-server for this run (set THINK_JOBS_REDIS_URL to use yours)."
    )
    with private_redis_server() as private:
        yield private


def _heading(text: str) -> None:
    click.echo()
    click.secho(f"▶ {text}", fg="cyan", bold=True)


def _print_text_of(agent: Think, request_id: str) -> tuple[str, str]:
    """Stream a request's text deltas to the terminal; returns (status, text)."""
    text: list[str] = []
    status = "?"
    for event in agent.stream(request_id, timeout_s=60):
        chunk: dict[str, Any] = event.chunk or {}
        if chunk.get("type") == "text-delta":
            text.append(chunk["delta"])
            click.echo(chunk["delta"], nl=False)
        if event.done:
            status = event.status or "?"
    click.echo()
    return status, "".join(text)


def webhook_with_duplicate(jobs: ThinkJobs) -> Row:
    _heading("A webhook delivers ticket #123 twice; one turn runs")
    agent = jobs.get_agent(examples.SupportDesk, "acme")
    event = f"evt-{uuid.uuid4().hex[:8]}"
    message = _user("Printer on fire (#123)", message_id=f"msg-{event}")
    first = agent.submit_messages([message], idempotency_key=event)
    retry = agent.submit_messages([message], idempotency_key=event)
    same = first.submission_id == retry.submission_id
    click.echo(f"delivery 1 accepted={first.accepted}; delivery 2 accepted={retry.accepted}")
    click.echo(f"same submission: {same}")
    status, text = _print_text_of(agent, first.submission_id)
    note = f"duplicate accepted={retry.accepted}"
    return Row("webhook x2", agent.address, first.submission_id, status, note, text)


def parent_delegates(jobs: ThinkJobs) -> Row:
    _heading("A parent agent delegates to a child agent (child's stream via callbacks)")
    agent = jobs.get_agent(examples.Lead, "weekly-review")
    result = agent.submit_messages([_user("How did the week go?")])
    status, text = _print_text_of(agent, result.submission_id)
    tool_output = _tool_output(agent)
    click.secho(f"  child said: {tool_output}", dim=True)
    return Row("parent → child", agent.address, result.submission_id, status, "via chat()", text)


def cancelled_turn(jobs: ThinkJobs) -> Row:
    _heading("A slow turn is cancelled half-way; the partial reply is kept")
    agent = jobs.get_agent(examples.Storyteller, "bedtime")
    result = agent.submit_messages([_user("Tell me a long story.")])
    words: list[str] = []
    for event in agent.stream(result.submission_id, timeout_s=60):
        chunk: dict[str, Any] = event.chunk or {}
        if chunk.get("type") == "text-delta":
            words.append(chunk["delta"])
            click.echo(chunk["delta"], nl=False)
            if len(words) == 15:
                agent.cancel_submission(result.submission_id, "The listener fell asleep.")
    click.echo()
    found = agent.inspect_submission(result.submission_id)
    status = found.status.value if found else "?"
    note = (found.error or "") if found else ""
    return Row(
        "cancel mid-stream", agent.address, result.submission_id, status, note, "".join(words)
    )


def scheduled_prompt(jobs: ThinkJobs) -> Row:
    _heading("A scheduled prompt ('every day at 09:00' UTC) fired on demand")
    agent = jobs.get_agent(examples.Reporter, "ops")
    try:
        fired = agent.run_scheduled_task("daily-report")
    except NotImplementedError:
        return Row("schedule run-now", agent.address, "-", "skipped", "schedules not wired", "")
    assert fired is not None
    status, text = _print_text_of(agent, fired.submission_id)
    return Row(
        "schedule run-now",
        agent.address,
        fired.submission_id,
        status,
        "run now",
        text,
    )


def _user(text: str, message_id: str | None = None) -> dict[str, Any]:
    parts = [{"type": "text", "text": text}]
    return {"id": message_id or str(uuid.uuid4()), "role": "user", "parts": parts}


def _tool_output(agent: Think) -> str:
    for part in agent.get_messages()[-1].parts:
        if part.type.startswith("tool-"):
            return json.dumps(getattr(part, "output", None))
    return ""


STEPS: tuple[Callable[[ThinkJobs], Row], ...] = (
    webhook_with_duplicate,
    parent_delegates,
    cancelled_turn,
    scheduled_prompt,
)


def _print_summary(rows: list[Row], where: str) -> None:
    """Every reply in full (folded, never cut), and where the turns ran."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="think-jobs demo summary", caption=f"every turn ran on a {where}")
    for column in ("step", "agent", "status", "note"):
        table.add_column(column, overflow="fold", no_wrap=False)
    table.add_column("reply", overflow="fold", ratio=1)
    for row in rows:
        table.add_row(row.step, row.agent, row.status, row.note, row.text)
    Console(width=max(110, Console().width)).print(table)
