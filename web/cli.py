"""``think-jobs web``: plugged into the ``think-jobs`` command through the ``think_jobs.commands``
entry point, so the core package never imports Flask."""

from __future__ import annotations

import click


@click.command()
@click.option("--app", "-A", "app_spec", default=None, help="ThinkJobs object as module:attr.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
def web(app_spec: str | None, host: str, port: int) -> None:
    """Serve the web app (development server; use gunicorn "web:create_app()" in production)."""
    from think_jobs.cli.common import load_app
    from web import create_app

    plain_http = {"SESSION_COOKIE_SECURE": False}  # the development server speaks http://
    create_app(load_app(app_spec), plain_http).run(host=host, port=port, threaded=True)
