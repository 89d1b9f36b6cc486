"""``think-jobs workers``: the live workers (and beat), what they serve and what they run.

Read from the presence records every worker keeps in Redis (``ThinkJobs.live_workers()``), so
it answers in one round trip and needs no broadcast to the workers.
"""

from __future__ import annotations

import json

import click

from think_jobs.cli.common import app_option, load_app
from think_jobs.results import WorkerRecord


@click.command()
@app_option
@click.option("--json", "as_json", is_flag=True, help="One JSON array instead of a table.")
@click.option(
    "--check", "check_name", default=None, help="Exit 1 unless NAME (e.g. beat@host) is live."
)
def workers(app_spec: str | None, as_json: bool, check_name: str | None) -> None:
    """List live workers: queues, agent types, concurrency, running tasks."""
    jobs = load_app(app_spec)
    live = jobs.live_workers()
    if check_name is not None:
        found = next((record for record in live if record.name == check_name), None)
        if found is None:
            raise click.ClickException(f"no live worker or beat named {check_name}")
        click.echo(f"{found.name} is live ({found.role}, pid {found.pid})")
        return
    if as_json:
        click.echo(json.dumps([record.model_dump(mode="json") for record in live], indent=2))
        return
    _print_table(live, queue=jobs.settings.queue)


def _print_table(live: list[WorkerRecord], *, queue: str) -> None:
    if not live:
        click.echo(f"no live workers (none has written its presence record; queue {queue})")
        return
    header = ("NAME", "ROLE", "QUEUES", "CONCURRENCY", "AGENT TYPES", "RUNNING")
    lines = [header, *(_cells(record) for record in live)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    for line in lines:
        cells = [cell.ljust(width) for cell, width in zip(line, widths, strict=False)]
        click.echo("  ".join([*cells, line[-1]]).rstrip())


def _cells(record: WorkerRecord) -> tuple[str, str, str, str, str, str]:
    running = "; ".join(record.running_described()) or "-"
    return (
        record.name,
        record.role,
        ", ".join(record.queues) or "-",
        "-" if record.concurrency is None else str(record.concurrency),
        ", ".join(record.agent_types) or ("none (no --app?)" if record.role == "worker" else "-"),
        running,
    )
