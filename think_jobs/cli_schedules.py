"""``think-jobs beat`` and ``think-jobs schedules ...`` (placeholders until beat lands)."""

from __future__ import annotations

import click


@click.group()
def schedules() -> None:
    """Scheduled tasks of agents."""


@click.command()
def beat() -> None:
    """Run Celery beat with the database scheduler."""
    raise click.ClickException("not available yet")
