"""What every ``think-jobs`` command shares: the ``--app`` option and loading the ``ThinkJobs``
object it names (think-jobs' own configuration errors become one usage line)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from think_jobs.app_loading import app_spec_of, check_database_url, load_app_or_default
from think_jobs.errors import ConfigurationError

if TYPE_CHECKING:  # importing the runtime is heavy; ``think-jobs --help`` does not need it
    from think_jobs.runtime import ThinkJobs

APP_HELP = "The ThinkJobs object as module:attribute (default: $THINK_JOBS_APP)."

app_option = click.option("--app", "-A", "app_spec", default=None, help=APP_HELP)


def load_app(spec: str | None) -> ThinkJobs:
    """The ThinkJobs object ``--app`` (or ``$THINK_JOBS_APP``) names; the defaults without one.
    A database URL that cannot work is refused here, in one line, before any command uses it."""
    try:
        jobs = load_app_or_default(spec)
    except ConfigurationError as error:
        raise click.UsageError(f"--app: {error}" if app_spec_of(spec) else str(error)) from error
    check_database_url(jobs.settings.database_url)
    return jobs


def load_app_with_agents(spec: str | None) -> ThinkJobs:
    """``load_app`` for commands that name an agent type: without ``--app`` there are none."""
    if app_spec_of(spec) is None:
        raise click.UsageError(
            "no --app given (and THINK_JOBS_APP is not set), so no agent types are known: "
            "pass --app module:jobs naming the module that registers your agents"
        )
    return load_app(spec)
