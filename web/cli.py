"""``think-jobs web``: plugged into the ``think-jobs`` command through the ``think_jobs.commands``
entry point, so the core package never imports Flask."""

from __future__ import annotations

import click


@click.command()
@click.option("--app", "-A", "app_spec", default=None, help="ThinkJobs object as module:attr.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option(
    "--end-sessions",
    is_flag=True,
    help="Log every admin session out (a leaked cookie, a departing operator), print how many, "
    "and exit instead of serving.",
)
def web(app_spec: str | None, host: str, port: int, end_sessions: bool) -> None:
    """Serve the web app (development server; use gunicorn "web:create_app()" in production)."""
    from think_jobs.cli.common import load_app
    from web import create_app, sessions

    jobs = load_app(app_spec)
    if end_sessions:
        ended = sessions.end_all(jobs)
        click.echo(f"{ended} admin session{'' if ended == 1 else 's'} ended")
        return
    plain_http = {"SESSION_COOKIE_SECURE": False}  # the development server speaks http://
    create_app(jobs, plain_http).run(host=host, port=port, threaded=True)
