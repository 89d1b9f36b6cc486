"""The command line, as a user runs it: subprocesses against real services."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import sqlalchemy

from tests.support.processes import ROOT, free_port


def think_jobs(
    *args: str, env: dict[str, str], timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("THINK_JOBS_")}
    return subprocess.run(
        [sys.executable, "-m", "think_jobs.cli", *args],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_db_upgrade_creates_the_schema(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    result = think_jobs("db", "upgrade", env={"THINK_JOBS_DATABASE_URL": url})
    assert result.returncode == 0, result.stderr
    assert "is up to date" in result.stdout
    tables = set(sqlalchemy.inspect(sqlalchemy.create_engine(url)).get_table_names())
    assert {"think_agents", "think_turns", "think_messages", "think_jobs_alembic_version"} <= tables


def test_misspelled_setting_is_an_error(tmp_path: Path) -> None:
    result = think_jobs("db", "upgrade", env={"THINK_JOBS_DATABSE_URL": "sqlite:///x.db"})
    assert result.returncode != 0
    assert "Unknown setting THINK_JOBS_DATABSE_URL; did you mean THINK_JOBS_DATABASE_URL?" in (
        result.stderr
    )


def test_demo_exits_zero_and_starts_redis_when_none_is_reachable(tmp_path: Path) -> None:
    env = {
        "THINK_JOBS_DATABASE_URL": f"sqlite:///{tmp_path / 'demo.db'}",
        "THINK_JOBS_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
    }
    result = think_jobs("demo", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "starting a private redis-server" in result.stdout
    assert "duplicate accepted=False" in result.stdout
    assert "aborted" in result.stdout and "The listener fell asleep." in result.stdout
    assert "Daily report: 42 tickets closed" in result.stdout
