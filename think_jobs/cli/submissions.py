"""``think-jobs submit|tail|submissions ...``: durable submissions from the command line.

Tables (rich) for people, ``--json`` for scripts.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import click

from think_jobs.cli.common import app_option, load_app_with_agents

if TYPE_CHECKING:
    from think_jobs.agent import Think
    from think_jobs.results import StreamEvent, SubmissionInspection

json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


def agent_of(app_spec: str | None, agent_type: str, name: str) -> Think:
    """The agent; without ``--app`` a usage error says so (no agent type can be known)."""
    return load_app_with_agents(app_spec).get_agent(agent_type, name)


def _dump(value: Any) -> None:
    click.echo(json.dumps(value, default=str, indent=None))


def _table(inspections: list[SubmissionInspection]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table()
    for column in ("submission", "status", "created", "completed", "error"):
        table.add_column(column, overflow="fold", no_wrap=column == "submission")
    for item in inspections:
        completed = item.completed_at.isoformat(timespec="seconds") if item.completed_at else ""
        created = item.created_at.isoformat(timespec="seconds")
        table.add_row(item.submission_id, item.status.value, created, completed, item.error or "")
    Console(width=max(140, Console().width)).print(table)


def _echo_event(event: StreamEvent, *, as_json: bool) -> None:
    if as_json:
        _dump(event.model_dump(mode="json"))
        return
    chunk = event.chunk or {}
    if chunk.get("type") == "text-delta":
        click.echo(chunk["delta"], nl=False)
    elif event.done:
        click.echo()
        click.secho(f"[{event.status}]" + (f" {event.error}" if event.error else ""), dim=True)


@click.command()
@app_option
@click.argument("agent_type")
@click.argument("name")
@click.argument("text")
@click.option("--idempotency-key", default=None, help="Makes retries of this command safe.")
@click.option("--follow", "-f", is_flag=True, help="Print the reply as it streams.")
@json_option
def submit(
    app_spec: str | None,
    agent_type: str,
    name: str,
    text: str,
    idempotency_key: str | None,
    follow: bool,
    as_json: bool,
) -> None:
    """Submit TEXT as a user message to agent AGENT_TYPE/NAME."""
    from think_jobs.messages import user_text_message

    if not text.strip():
        raise click.BadParameter("the message is empty", param_hint="TEXT")
    agent = agent_of(app_spec, agent_type, name)
    result = agent.submit_messages([user_text_message(text)], idempotency_key=idempotency_key)
    if as_json:
        _dump(result.model_dump(mode="json"))
    else:
        state = "accepted" if result.accepted else "already submitted"
        click.echo(f"{result.submission_id} {state} ({result.status.value})")
    if follow:
        for event in agent.stream(result.submission_id):
            _echo_event(event, as_json=as_json)


@click.command()
@app_option
@click.argument("agent_type")
@click.argument("name")
@click.argument("request_id", required=False)
@click.option("--after-seq", type=int, default=None, help="Resume after this seq.")
@click.option("--timeout", "timeout_s", type=float, default=None, help="Give up after seconds.")
@json_option
def tail(
    app_spec: str | None,
    agent_type: str,
    name: str,
    request_id: str | None,
    after_seq: int | None,
    timeout_s: float | None,
    as_json: bool,
) -> None:
    """Follow one request's stream (replay + live), or every request of the agent live."""
    agent = agent_of(app_spec, agent_type, name)
    if request_id is not None and not _request_exists(agent, request_id):
        raise click.ClickException(f"no such request {request_id} for agent {agent.address}")
    try:
        if request_id is None:
            for event in agent.subscribe(timeout_s=timeout_s):
                _echo_event(event, as_json=as_json)
            return
        for event in agent.stream(request_id, after_seq=after_seq, timeout_s=timeout_s):
            _echo_event(event, as_json=as_json)
    except TimeoutError as error:
        raise click.ClickException(str(error)) from error


@click.group()
def submissions() -> None:
    """Inspect, list, cancel and prune durable submissions."""


def _request_exists(agent: Think, request_id: str) -> bool:
    """Whether the agent has (or had, not yet pruned) a turn with this request id."""
    return agent.request_status(request_id) is not None


@submissions.command("list")
@app_option
@click.argument("agent_type")
@click.argument("name")
@click.option("--status", "statuses", multiple=True, help="Filter (repeatable).")
@click.option("--limit", type=click.IntRange(1, 100), default=50, show_default=True)
@click.option("--before", default=None, help="Only older than this submission id (next page).")
@json_option
def list_command(
    app_spec: str | None,
    agent_type: str,
    name: str,
    statuses: tuple[str, ...],
    limit: int,
    before: str | None,
    as_json: bool,
) -> None:
    """Newest first."""
    agent = agent_of(app_spec, agent_type, name)
    found = agent.list_submissions(status=list(statuses) or None, limit=limit, before=before)
    if as_json:
        _dump([item.model_dump(mode="json") for item in found])
    else:
        _table(found)


@submissions.command("inspect")
@app_option
@click.argument("agent_type")
@click.argument("name")
@click.argument("submission_id")
@json_option
def inspect_command(
    app_spec: str | None, agent_type: str, name: str, submission_id: str, as_json: bool
) -> None:
    """One submission; exit status 1 if it does not exist."""
    found = agent_of(app_spec, agent_type, name).inspect_submission(submission_id)
    if found is None:
        raise click.ClickException(f"no submission {submission_id} for {agent_type}:{name}")
    if as_json:
        _dump(found.model_dump(mode="json"))
        return
    _table([found])
    if found.waiting_reason:
        click.echo(f"{found.status.value}: {found.waiting_reason}")


@submissions.command("cancel")
@app_option
@click.argument("agent_type")
@click.argument("name")
@click.argument("submission_id")
@click.option("--reason", default=None)
def cancel_command(
    app_spec: str | None, agent_type: str, name: str, submission_id: str, reason: str | None
) -> None:
    """Abort a pending or running submission (no-op if unknown or finished)."""
    agent = agent_of(app_spec, agent_type, name)
    agent.cancel_submission(submission_id, reason)
    found = agent.inspect_submission(submission_id)
    click.echo(f"{submission_id}: {found.status.value if found else 'unknown'}")


@submissions.command("prune")
@app_option
@click.argument("agent_type")
@click.argument("name")
@click.option(
    "--older-than-days",
    type=click.FloatRange(min=0),
    default=None,
    help="Completed before N days ago.",
)
@click.option("--status", "statuses", multiple=True, help="Default: every terminal status.")
@click.option("--limit", type=click.IntRange(1, 500), default=500, show_default=True)
@json_option
def prune_command(
    app_spec: str | None,
    agent_type: str,
    name: str,
    older_than_days: float | None,
    statuses: tuple[str, ...],
    limit: int,
    as_json: bool,
) -> None:
    """Delete terminal submissions, oldest completed first."""
    cutoff = None
    if older_than_days is not None:
        cutoff = datetime.now(UTC) - timedelta(days=older_than_days)
    agent = agent_of(app_spec, agent_type, name)
    deleted = agent.delete_submissions(
        status=list(statuses) or None, completed_before=cutoff, limit=limit
    )
    _dump({"deleted": deleted}) if as_json else click.echo(f"deleted {deleted}")
