"""Using think-jobs from your own folder (issue 16): a wheel built from the checkout installs
into a fresh virtualenv (without setuptools' license deprecation banner), and the installed
``think-jobs`` command works from another directory, with an app module of that directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import ROOT

APP = """
from think_jobs import Think, ThinkJobs
from think_jobs.models import ScriptedModel

jobs = ThinkJobs()


@jobs.register
class Support(Think):
    def get_model(self) -> ScriptedModel:
        return ScriptedModel("Thanks, we are on it.")
"""


def run(command: list[str], cwd: Path, env: dict[str, str]) -> str:
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{command}:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_wheel_of_the_checkout_installs_and_runs_from_another_directory(
    tmp_path: Path, settings_env: dict[str, str]
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env = {k: v for k, v in env.items() if not k.startswith("THINK_JOBS_")}
    built = run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", str(ROOT), "-w", str(tmp_path)],
        tmp_path,
        env,
    )
    assert "deprecated" not in built.lower(), built  # setuptools' project.license banner
    (wheel,) = tmp_path.glob("think_jobs-*.whl")
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], tmp_path, env)
    run([str(venv / "bin" / "pip"), "install", "--quiet", str(wheel)], tmp_path, env)

    elsewhere = tmp_path / "my-project"
    elsewhere.mkdir()
    (elsewhere / "myagents.py").write_text(APP)
    cli = str(venv / "bin" / "think-jobs")
    assert run([cli, "--version"], elsewhere, env).startswith("think-jobs, version 0.1.0")
    mine = {**env, **settings_env, "THINK_JOBS_DATABASE_URL": f"sqlite:///{elsewhere / 'my.db'}"}
    assert "migrated from empty" in run([cli, "db", "upgrade"], elsewhere, mine)
    submit = [cli, "submit", "--app", "myagents:jobs", "Support", "a", "Hi", "--json"]
    submitted = json.loads(run(submit, elsewhere, mine))
    assert submitted["accepted"] is True and submitted["status"] == "pending"
    probe = [str(venv / "bin" / "python"), "-c", "import think_jobs; print(think_jobs.__file__)"]
    where = run(probe, elsewhere, env)
    assert str(venv) in where and str(ROOT) not in where
