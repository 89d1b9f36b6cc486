"""``think-jobs dev``: worker, beat and web in one command, for laptops.

It prints one block a second terminal can paste (the Redis and database it uses, the app, the
generated token), so ``think-jobs submit ... --follow`` there talks to the same services. An
explicit ``THINK_JOBS_REDIS_URL`` that does not answer is refused; without one, a private
``redis-server`` is started for the run.
"""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from types import FrameType

import click

from think_jobs.cli.common import APP_HELP, load_app

EXAMPLES_APP = "think_jobs.cli.examples:jobs"


@click.command()
@click.option("--app", "-A", "app_spec", default=None, help=APP_HELP + " Default: examples.")
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--concurrency", "-c", default=4, show_default=True, type=int)
def dev(app_spec: str | None, port: int, concurrency: int) -> None:
    """Worker, beat and web together on local defaults; Ctrl-C stops everything."""
    spec = app_spec or os.environ.get("THINK_JOBS_APP") or EXAMPLES_APP
    jobs = load_app(spec)
    with ExitStack() as stack:
        redis_url = _redis_for(stack, jobs.settings.redis_url)
        jobs.migrate()
        database_url = _absolute_sqlite(jobs.settings.database_url)
        env, token = _child_env(spec, redis_url, database_url, jobs.settings.api_tokens)
        children = stack.enter_context(_children(spec, env, port=port, concurrency=concurrency))
        _announce(port, env, token)
        _wait(children)


def _redis_for(stack: ExitStack, url: str) -> str:
    """``url`` when it answers; a private redis-server when no Redis was asked for."""
    from think_jobs.cli.local_redis import masked, private_redis_server, reachable

    if reachable(url):
        return url
    if "THINK_JOBS_REDIS_URL" in os.environ:
        raise click.ClickException(
            f"THINK_JOBS_REDIS_URL={masked(url)} does not answer: start that Redis, or unset "
            "THINK_JOBS_REDIS_URL and think-jobs dev starts a private one"
        )
    click.echo(f"No Redis at {url}; starting a private redis-server for this run.")
    return stack.enter_context(private_redis_server())


def _absolute_sqlite(url: str) -> str:
    """A relative SQLite path made absolute, so a terminal elsewhere finds the same file."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or url.startswith(prefix + "/") or ":memory:" in url:
        return url
    return prefix + os.path.abspath(url.removeprefix(prefix))


def _child_env(
    spec: str, redis_url: str, database_url: str, tokens: tuple[object, ...]
) -> tuple[dict[str, str], str]:
    env = {
        **os.environ,
        "THINK_JOBS_APP": spec,
        "THINK_JOBS_REDIS_URL": redis_url,
        "THINK_JOBS_DATABASE_URL": database_url,
    }
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
    base = [sys.executable, "-m", "think_jobs.cli.main"]
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


_SECRETS = frozenset(
    {
        "THINK_JOBS_SECRET_KEY",
        "THINK_JOBS_API_TOKENS",
        "THINK_JOBS_READ_TOKENS",
        "THINK_JOBS_WEBHOOK_SECRET",
    }
)


def paste_block(port: int, env: dict[str, str], token: str) -> list[str]:
    """The lines a second terminal pastes to reach this run's services: every
    ``THINK_JOBS_*`` setting of the run (never a secret of yours), plus a generated token."""
    names = sorted(k for k in env if k.startswith("THINK_JOBS_") and k not in _SECRETS)
    lines = [f"export {name}={shlex.quote(env[name])}" for name in names]
    if token:
        lines.append(f"export THINK_JOBS_API_TOKENS={shlex.quote(token)}  # generated for this run")
    lines.append(f"# web: http://127.0.0.1:{port}/admin (log in with the token)")
    return lines


def _announce(port: int, env: dict[str, str], token: str) -> None:
    click.secho(f"think-jobs dev: admin at http://127.0.0.1:{port}/admin", bold=True)
    click.echo("In another terminal, paste this, then e.g. `think-jobs submit TYPE NAME Hi -f`:")
    click.echo()
    for line in paste_block(port, env, token):
        click.echo(f"    {line}")
    click.echo()
    click.echo("Press Ctrl-C to stop worker, beat and web.")


_STOP_GRACE_S = 1.0  # a stop signal to the group lands within this after a child stopped on it


class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def _wait(children: list[subprocess.Popen[bytes]]) -> None:
    """Return on Ctrl-C/SIGTERM, or fail if a child dies on its own.

    Both signals get this process's own handler: a SIGINT inherited as ignored (a shell
    starts a command run with ``&`` so: ``think-jobs dev &`` in a script, a CI job) left dev
    running while its children, which handle SIGINT themselves, stopped on the group's
    Ctrl-C; dev then reported them as exiting unexpectedly (exit 1). And Ctrl-C reaches the
    whole group, so a child may stop before this process runs its handler: a dead child is
    given a moment for the stop to land inside the ``try`` before it counts as a failure."""
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    try:
        while all(child.poll() is None for child in children):
            time.sleep(0.5)
        time.sleep(_STOP_GRACE_S)
    except _Stop:
        click.echo("\nstopping...")
        return
    dead = [child.args for child in children if child.poll() is not None]
    raise click.ClickException(f"a process exited unexpectedly: {dead}")
