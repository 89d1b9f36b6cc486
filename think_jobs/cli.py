"""``think-jobs``: the command line (click). Heavy imports happen inside commands."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from think_jobs.runtime import ThinkJobs

APP_HELP = "The ThinkJobs object as module:attribute (default: $THINK_JOBS_APP)."


def load_app(spec: str | None) -> ThinkJobs:
    """The ThinkJobs object ``--app`` (or ``$THINK_JOBS_APP``) names; the defaults without one."""
    from think_jobs.app_loading import APP_VARIABLE, load_jobs
    from think_jobs.errors import ConfigurationError
    from think_jobs.runtime import ThinkJobs

    spec = spec or os.environ.get(APP_VARIABLE)
    if not spec:
        return ThinkJobs()
    try:
        return load_jobs(spec)
    except ConfigurationError as error:
        raise click.UsageError(f"--app: {error}") from error


app_option = click.option("--app", "-A", "app_spec", default=None, help=APP_HELP)


class _Group(click.Group):
    """Shows think-jobs errors (bad settings, unknown agents, services down) as one line."""

    def invoke(self, ctx: click.Context) -> Any:
        from think_jobs.errors import ThinkJobsError

        try:
            return super().invoke(ctx)
        except ThinkJobsError as error:
            raise click.ClickException(f"{type(error).__name__}: {error}") from error


@click.group(cls=_Group)
def main() -> None:
    """think-jobs: durable LLM agent turns on Celery workers."""


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@app_option
@click.option("--concurrency", "-c", type=int, default=None, help="Worker slots.")
@click.option("--pool", "-P", default="threads", show_default=True, help="Celery pool.")
@click.option("--loglevel", "-l", default="INFO", show_default=True)
@click.option("--metrics-port", type=int, default=None, help="Serve Prometheus /metrics here.")
@click.pass_context
def worker(
    ctx: click.Context,
    app_spec: str | None,
    concurrency: int | None,
    pool: str,
    loglevel: str,
    metrics_port: int | None,
) -> None:
    """Run a Celery worker for the app's agents (extra options go to ``celery worker``)."""
    jobs = load_app(app_spec)
    if metrics_port is not None:
        from think_jobs.metrics import start_metrics_server

        start_metrics_server(jobs, metrics_port)
    argv = ["worker", f"--pool={pool}", f"--loglevel={loglevel}", f"-Q{jobs.settings.queue}"]
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
    jobs = load_app(app_spec)
    jobs.migrate()
    click.echo(
        f"database at {jobs.db.engine.url.render_as_string(hide_password=True)} is up to date"
    )


@main.command()
@click.option(
    "--database-url", default=None, help="Default: THINK_JOBS_DATABASE_URL or ./think_jobs.db"
)
def demo(database_url: str | None) -> None:
    """Run the bundled example agents end to end on the embedded defaults."""
    from think_jobs.demo import run_demo

    sys.exit(run_demo(database_url=database_url))


def _add_commands() -> None:
    from importlib.metadata import entry_points

    from think_jobs.cli_dev import dev
    from think_jobs.cli_schedules import beat, schedules
    from think_jobs.cli_submissions import submissions, submit, tail

    for command in (beat, schedules, dev, submit, tail, submissions):
        main.add_command(command)
    for plugin in entry_points(group="think_jobs.commands"):  # e.g. ``web`` from the web package
        main.add_command(plugin.load(), plugin.name)


_add_commands()

if __name__ == "__main__":
    main()
