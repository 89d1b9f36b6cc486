"""``think-jobs``: the command line (click). Heavy imports happen inside commands.

Every command names the user's ``ThinkJobs`` object with ``--app module:attribute`` (or
``$THINK_JOBS_APP``); think-jobs errors print as one line and exit 1.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from think_jobs.cli.common import app_option, load_app


class _Group(click.Group):
    """Shows think-jobs errors (bad settings, unknown agents, services down) as one line."""

    def invoke(self, ctx: click.Context) -> Any:
        from think_jobs.errors import ThinkJobsError

        try:
            return super().invoke(ctx)
        except ThinkJobsError as error:
            raise click.ClickException(f"{type(error).__name__}: {error}") from error


@click.group(cls=_Group)
@click.version_option(package_name="think-jobs", prog_name="think-jobs")
def main() -> None:
    """think-jobs: durable LLM agent turns on Celery workers."""


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@app_option
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(min=1),
    default=None,
    help="Turns at once (LLM turns mostly wait: up to ~100 per process on 2 cores).",
)
@click.option(
    "--pool", "-P", default="threads", show_default=True, help="Celery pool (threads: LLM turns)."
)
@click.option("--loglevel", "-l", default=None, help="Default: $THINK_JOBS_LOG_LEVEL (INFO).")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None, help="/metrics.")
@click.pass_context
def worker(
    ctx: click.Context,
    app_spec: str | None,
    concurrency: int | None,
    pool: str,
    loglevel: str | None,
    metrics_port: int | None,
) -> None:
    """Run a Celery worker for the app's agents (extra options go to 'celery worker')."""
    from think_jobs.observe.logs import level_number

    jobs = load_app(app_spec)
    level = loglevel or jobs.settings.log_level
    level_number(level)  # an unknown level is one line here, not a Celery traceback
    if metrics_port is not None:
        from think_jobs.observe.metrics import start_metrics_server

        start_metrics_server(jobs, metrics_port)
    argv = ["worker", f"--pool={pool}", f"--loglevel={level}", f"-Q{jobs.settings.queue}"]
    if concurrency is not None:
        argv.append(f"--concurrency={concurrency}")
    jobs.celery.worker_main([*argv, *ctx.args])


@main.group()
def db() -> None:
    """Database schema commands."""


@db.command("upgrade")
@app_option
def db_upgrade(app_spec: str | None) -> None:
    """Apply the think-jobs migrations to the configured database."""
    from think_jobs.db.migrate import upgrade

    jobs = load_app(app_spec)
    where = jobs.db.engine.url.render_as_string(hide_password=True)
    upgraded = upgrade(jobs.db)  # both revisions read under the upgrade's lock
    before, after = upgraded.before, upgraded.after
    if before == after:
        click.echo(f"database at {where} is up to date (revision {after})")
    else:
        click.echo(f"database at {where} migrated from {before or 'empty'} to revision {after}")


@main.command()
@click.option(
    "--database-url", default=None, help="Default: THINK_JOBS_DATABASE_URL or ./think_jobs.db"
)
def demo(database_url: str | None) -> None:
    """Run the bundled example agents end to end on the embedded defaults."""
    from think_jobs.cli.demo import run_demo

    sys.exit(run_demo(database_url=database_url))


def _add_commands() -> None:
    from importlib.metadata import entry_points

    from think_jobs.cli.dev import dev
    from think_jobs.cli.messages import messages
    from think_jobs.cli.schedules import beat, schedules
    from think_jobs.cli.submissions import submissions, submit, tail
    from think_jobs.cli.workers import workers

    for command in (messages, beat, schedules, dev, submit, tail, submissions, workers):
        main.add_command(command)
    for plugin in entry_points(group="think_jobs.commands"):  # e.g. ``web`` from the web package
        main.add_command(plugin.load(), plugin.name)


_add_commands()

if __name__ == "__main__":
    main()
