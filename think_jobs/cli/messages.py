"""``think-jobs messages check|remove|repair``: operator repairs of stored conversations.

When an agent's history cannot be read back (``StoredMessageError``: a row stored by an older
version, or edited by hand), ``check`` lists the messages at fault, ``remove`` deletes one and
``repair`` keeps what reads back of it. The functions are ``think_jobs.engine.repair``'s.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING

import click

from think_jobs.cli.common import app_option, load_app

if TYPE_CHECKING:
    from think_jobs.agent import Think

json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


def _agent(app_spec: str | None, agent_type: str, name: str) -> Think:
    return load_app(app_spec).get_agent(agent_type, name)


@click.group()
def messages() -> None:
    """Find, remove or repair stored messages that no longer read back."""


@messages.command("check")
@app_option
@click.argument("agent_type")
@click.argument("name")
@json_option
def check(app_spec: str | None, agent_type: str, name: str, as_json: bool) -> None:
    """List the messages of AGENT_TYPE/NAME that cannot be read back (exit 1 if any)."""
    found = _agent(app_spec, agent_type, name).unreadable_messages()
    if as_json:
        click.echo(json.dumps([asdict(item) for item in found]))
    for item in [] if as_json else found:
        click.echo(f"{item.message_id}\tposition {item.position}\t{item.reason}")
    if not found and not as_json:
        click.echo("every stored message reads back")
    if found:
        raise SystemExit(1)


@messages.command("remove")
@app_option
@click.argument("agent_type")
@click.argument("name")
@click.argument("message_id")
def remove(app_spec: str | None, agent_type: str, name: str, message_id: str) -> None:
    """Delete MESSAGE_ID from the conversation of AGENT_TYPE/NAME."""
    agent = _agent(app_spec, agent_type, name)
    if not agent.remove_message(message_id):
        raise click.ClickException(f"agent {agent.address} has no stored message {message_id!r}")
    click.echo(f"removed message {message_id} of {agent.address}")


@messages.command("repair")
@app_option
@click.argument("agent_type")
@click.argument("name")
@click.argument("message_id")
def repair(app_spec: str | None, agent_type: str, name: str, message_id: str) -> None:
    """Keep what reads back of MESSAGE_ID (its readable parts and metadata), in place."""
    agent = _agent(app_spec, agent_type, name)
    result = agent.repair_message(message_id)
    if not (result.dropped or result.mended):
        click.echo(f"message {message_id} of {agent.address} reads back; nothing to repair")
        return
    if result.mended:
        click.echo("replaced each lone surrogate in its text by U+FFFD")
    for what in result.dropped:
        click.echo(f"dropped {what}")
    click.echo(f"repaired message {message_id} of {agent.address}: {result.kept_parts} parts kept")
