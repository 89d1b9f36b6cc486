"""The command line, as a user runs it: subprocesses against real services."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy

from tests.support.processes import ROOT, free_port


def think_jobs(
    *args: str, env: dict[str, str], timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("THINK_JOBS_")}
    return subprocess.run(
        [sys.executable, "-m", "think_jobs.cli.main", *args],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_db_upgrade_creates_the_schema_and_says_what_it_did(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    result = think_jobs("db", "upgrade", env={"THINK_JOBS_DATABASE_URL": url})
    assert result.returncode == 0, result.stderr
    head = _head_revision()
    assert f"migrated from empty to revision {head}" in result.stdout
    tables = set(sqlalchemy.inspect(sqlalchemy.create_engine(url)).get_table_names())
    assert {"think_agents", "think_turns", "think_messages", "think_jobs_alembic_version"} <= tables
    again = think_jobs("db", "upgrade", env={"THINK_JOBS_DATABASE_URL": url})
    assert again.returncode == 0, again.stderr
    assert f"is up to date (revision {head})" in again.stdout


def _head_revision() -> str:
    from alembic.script import ScriptDirectory

    from think_jobs.db.migrate import MIGRATIONS

    head = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    assert head is not None
    return head


def test_misspelled_setting_is_an_error(tmp_path: Path) -> None:
    result = think_jobs("db", "upgrade", env={"THINK_JOBS_DATABSE_URL": "sqlite:///x.db"})
    assert result.returncode != 0
    assert "Unknown setting THINK_JOBS_DATABSE_URL; did you mean THINK_JOBS_DATABASE_URL?" in (
        result.stderr
    )


def test_demo_runs_on_a_private_redis_that_it_stops(tmp_path: Path) -> None:
    env = {"THINK_JOBS_DATABASE_URL": f"sqlite:///{tmp_path / 'demo.db'}"}
    result = think_jobs("demo", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "Starting a private redis-server for this run" in out
    port = int(re.search(r"redis redis://127\.0\.0\.1:(\d+)/0", out).group(1))  # type: ignore[union-attr]
    with pytest.raises(OSError):  # the private redis-server is gone with the demo
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    assert "duplicate accepted=False" in out
    assert "aborted" in out and "The listener fell asleep." in out
    assert "Daily report: 42 tickets closed, 3 open, no incidents." in out
    summary = out[out.index("think-jobs demo summary") :]
    assert "every turn ran on a Celery worker" in summary
    unfolded = " ".join(line.strip(" │┃|") for line in summary.splitlines())
    assert "Ticket received, we are on it:" in unfolded and "..." not in summary


def test_demo_refuses_an_explicit_redis_that_does_not_answer(tmp_path: Path) -> None:
    env = {
        "THINK_JOBS_DATABASE_URL": f"sqlite:///{tmp_path / 'demo.db'}",
        "THINK_JOBS_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
    }
    result = think_jobs("demo", env=env)
    assert result.returncode == 1
    assert "does not answer" in result.stderr and "Traceback" not in result.stderr
