"""``think-jobs beat`` and ``think-jobs schedules list|run``: run and look at agent schedules.

Kept apart from ``cli.py`` so the schedule commands can grow without making every command's
start-up pay for them: Celery, SQLAlchemy and the app are imported inside the commands.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

import click

from think_jobs.cli.common import app_option, load_app, load_app_with_agents

if TYPE_CHECKING:
    from think_jobs.db.schedules import KeptFire, StoredSchedule
    from think_jobs.runtime import ThinkJobs


def _load(app_spec: str | None) -> ThinkJobs:
    return load_app(app_spec)


@click.command()
@app_option
@click.option("--loglevel", "-l", default="INFO", show_default=True)
def beat(app_spec: str | None, loglevel: str) -> None:
    """Run Celery beat with the database scheduler (fires every agent's scheduled tasks)."""
    from think_jobs.worker.beat import DatabaseScheduler

    jobs = _load(app_spec)
    jobs.celery.Beat(scheduler=DatabaseScheduler, loglevel=loglevel).run()


@click.group()
def schedules() -> None:
    """Scheduled tasks of agents."""


@schedules.command("list")
@app_option
@click.option("--json", "as_json", is_flag=True, help="One JSON array instead of a table.")
def list_schedules(app_spec: str | None, as_json: bool) -> None:
    """Each agent's scheduled tasks and when they fire next (local and UTC)."""
    from think_jobs.db import schedules as schedule_ops

    jobs = _load(app_spec)
    with jobs.db.read() as conn:
        stored = schedule_ops.list_all(conn)
        kept = schedule_ops.kept_fires(conn)
    unfired: dict[int, list[KeptFire]] = {}
    for fire in kept:
        unfired.setdefault(fire.schedule_id, []).append(fire)
    if as_json:
        listing = [_listing(row, unfired.get(row.id, [])) for row in stored]
        click.echo(json.dumps(listing, indent=2))
        return
    _print_table(stored)
    _print_unfired(kept)
    _print_unused_classes(jobs, {row.agent_type for row in stored})


@schedules.command("run")
@click.argument("agent_type")
@click.argument("name")
@click.argument("task_id")
@app_option
@click.option("--at", "at", default=None, help="Occurrence to fire (ISO 8601, with offset).")
def run_schedule(
    agent_type: str, name: str, task_id: str, app_spec: str | None, at: str | None
) -> None:
    """Fire TASK_ID of the agent NAME of AGENT_TYPE now; prints the submission id."""
    from think_jobs.errors import ThinkJobsError

    scheduled_for = _occurrence(at)
    jobs = load_app_with_agents(app_spec)
    try:
        agent = jobs.get_agent(agent_type, name)
        result = agent.run_scheduled_task(task_id, scheduled_for=scheduled_for)
    except ThinkJobsError as error:
        raise click.ClickException(str(error)) from error
    except Exception as error:  # a handler's own failure: report it like beat's worker would
        raise click.ClickException(f"{task_id} failed: {error!r}") from error
    if result is None:
        click.echo(f"handler {task_id} of {agent.address} ran")
        return
    click.echo(result.submission_id)
    if not result.accepted:
        click.echo("(this occurrence was already submitted; nothing added)", err=True)


def _occurrence(at: str | None) -> datetime | None:
    if at is None:
        return None
    try:
        moment = datetime.fromisoformat(at)
    except ValueError as error:
        raise click.BadParameter(
            f"{at!r} is not an ISO 8601 datetime", param_hint="--at"
        ) from error
    if moment.tzinfo is None:
        raise click.BadParameter(
            "give an offset, e.g. 2026-06-01T09:00:00+00:00", param_hint="--at"
        )
    return moment


def _local(row: StoredSchedule) -> datetime:
    """The next run in the task's zone (wall-clock tasks) or this machine's (intervals)."""
    return row.next_run_at.astimezone(ZoneInfo(row.timezone) if row.timezone else None)


def _listing(row: StoredSchedule, unfired: list[KeptFire]) -> dict[str, Any]:
    last = row.last_scheduled_for
    return {
        "agent_type": row.agent_type,
        "agent_name": row.agent_name,
        "task_id": row.task_id,
        "schedule": row.schedule,
        "timezone": row.timezone,
        "next_run_at": row.next_run_at.isoformat(),
        "next_run_local": _local(row).isoformat(),
        "last_scheduled_for": None if last is None else last.isoformat(),
        "unfired": [_unfired(fire) for fire in unfired],
    }


def _unfired(fire: KeptFire) -> dict[str, Any]:
    return {
        "scheduled_for": fire.due_at.isoformat(),
        "attempt": fire.attempt,
        "resend_at": fire.resend_at.isoformat(),
        "held": fire.held,
    }


def _print_unfired(kept: list[KeptFire]) -> None:
    """Occurrences claimed and not fired yet (in flight, retrying, or lost and due to be sent
    again by beat at the time shown)."""
    if not kept:
        return
    click.echo(f"{len(kept)} claimed, not fired yet (beat sends each again at its time):")
    for fire in kept:
        when = fire.resend_at.strftime("%Y-%m-%d %H:%M:%S UTC")
        state = f"a worker is firing it (held until {when})" if fire.held else f"again at {when}"
        click.echo(
            f"  {fire.address} {fire.task_id} for {fire.due_at.isoformat()}: attempt "
            f"{fire.attempt}, {state}"
        )


def _print_table(stored: list[StoredSchedule]) -> None:
    if not stored:
        click.echo("no armed schedules (agents get theirs when first written to or started)")
        return
    header = ("AGENT", "TASK", "SCHEDULE", "NEXT (LOCAL)", "NEXT (UTC)")
    lines = [header, *(_cells(row) for row in stored)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        cells = (cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        click.echo("  ".join(cells).rstrip())


def _cells(row: StoredSchedule) -> tuple[str, str, str, str, str]:
    return (
        row.address,
        row.task_id,
        row.schedule,
        _local(row).strftime("%Y-%m-%d %H:%M:%S %Z"),
        row.next_run_at.strftime("%Y-%m-%d %H:%M:%S UTC"),
    )


def _print_unused_classes(jobs: ThinkJobs, listed: set[str]) -> None:
    """Registered classes with tasks but no agent yet (nothing to fire until one exists)."""
    for agent_type in jobs.agent_types:
        if agent_type in listed:
            continue
        tasks = jobs.instantiate(agent_type, "__registration__").get_scheduled_tasks()
        if tasks:
            names = ", ".join(sorted(tasks))
            click.echo(f"{agent_type}: no agents yet (declares {names})")
