"""``think-jobs dev``: worker, beat and web in one command, for laptops."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from types import FrameType

import click

_APP_HELP = "The ThinkJobs object as module:attribute (default: $THINK_JOBS_APP)."
EXAMPLES_APP = "think_jobs.examples:jobs"


@click.command()
@click.option("--app", "-A", "app_spec", default=None, help=_APP_HELP + " Default: examples.")
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--concurrency", "-c", default=4, show_default=True, type=int)
def dev(app_spec: str | None, port: int, concurrency: int) -> None:
    """Worker, beat and web together on local defaults; Ctrl-C stops everything."""
    from think_jobs.cli import load_app
    from think_jobs.local_redis import private_redis_server, reachable

    spec = app_spec or os.environ.get("THINK_JOBS_APP") or EXAMPLES_APP
    jobs = load_app(spec)
    with ExitStack() as stack:
        redis_url = jobs.settings.redis_url
        if not reachable(redis_url):
            click.echo(f"No Redis at {redis_url}; starting a private redis-server.")
            redis_url = stack.enter_context(private_redis_server())
        jobs.migrate()
        env, token = _child_env(spec, redis_url, jobs.settings.api_tokens)
        children = stack.enter_context(_children(spec, env, port=port, concurrency=concurrency))
        _announce(port, token)
        _wait(children)


def _child_env(spec: str, redis_url: str, tokens: tuple[object, ...]) -> tuple[dict[str, str], str]:
    env = {**os.environ, "THINK_JOBS_APP": spec, "THINK_JOBS_REDIS_URL": redis_url}
    token = ""
    if not tokens:
        token = secrets.token_urlsafe(24)
        env["THINK_JOBS_API_TOKENS"] = token
    env.setdefault("THINK_JOBS_SECRET_KEY", secrets.token_urlsafe(32))
    return env, token


@contextmanager
def _children(
    spec: str, env: dict[str, str], *, port: int, concurrency: int
) -> Iterator[list[subprocess.Popen[bytes]]]:
    base = [sys.executable, "-m", "think_jobs.cli"]
    commands = [
        [*base, "worker", "--app", spec, "-c", str(concurrency), "-l", "WARNING"],
        [*base, "beat", "--app", spec, "-l", "WARNING"],
        [*base, "web", "--app", spec, "--port", str(port)],
    ]
    children = [subprocess.Popen(command, env=env) for command in commands]
    try:
        yield children
    finally:
        _stop(children)


def _stop(children: list[subprocess.Popen[bytes]]) -> None:
    for child in children:
        if child.poll() is None:
            child.terminate()
    deadline = time.monotonic() + 20
    for child in children:
        try:
            child.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(5)


def _announce(port: int, token: str) -> None:
    click.secho(f"think-jobs dev: admin at http://127.0.0.1:{port}/admin", bold=True)
    if token:
        click.echo(f"API and admin token (generated for this run): {token}")
    click.echo("Press Ctrl-C to stop worker, beat and web.")


class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def _wait(children: list[subprocess.Popen[bytes]]) -> None:
    """Return on Ctrl-C/SIGTERM, or fail if a child dies on its own."""
    signal.signal(signal.SIGTERM, _raise_stop)
    try:
        while all(child.poll() is None for child in children):
            time.sleep(0.5)
    except (KeyboardInterrupt, _Stop):
        click.echo("\nstopping...")
        return
    dead = [child.args for child in children if child.poll() is not None]
    raise click.ClickException(f"a process exited unexpectedly: {dead}")
