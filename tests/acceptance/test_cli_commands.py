"""Every think-jobs command as a subprocess against real services (issue 7)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest

from tests.acceptance.test_cli import think_jobs
from tests.apps.agents import Support
from tests.support.builders import wait_for_status, wait_until
from tests.support.processes import ROOT, free_port, worker_processes
from think_jobs import ThinkJobs

APP = ["--app", "tests.apps.agents:jobs"]


@pytest.fixture
def env(settings_env: dict[str, str]) -> dict[str, str]:
    return settings_env


def run_ok(*args: str, env: dict[str, str]) -> str:
    result = think_jobs(*args, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_submit_follow_and_submissions_commands(jobs: ThinkJobs, env: dict[str, str]) -> None:
    with worker_processes(env, count=1):
        out = run_ok(
            "submit",
            *APP,
            "Support",
            "cli",
            "Hello",
            "--idempotency-key",
            "k1",
            "--follow",
            env=env,
        )
    assert "accepted (pending)" in out and "Thanks, we are on it." in out and "[completed]" in out
    again = json.loads(
        run_ok(
            "submit", *APP, "Support", "cli", "Hello", "--idempotency-key", "k1", "--json", env=env
        )
    )
    assert again["accepted"] is False and again["status"] == "completed"
    listed = json.loads(run_ok("submissions", "list", *APP, "Support", "cli", "--json", env=env))
    assert [item["submission_id"] for item in listed] == [again["submission_id"]]
    older = ("submissions", "list", *APP, "Support", "cli", "--before")
    assert json.loads(run_ok(*older, again["submission_id"], "--json", env=env)) == []
    unknown = think_jobs(*older, "nope", env=env)
    assert unknown.returncode == 1 and "UnknownCursorError" in unknown.stderr
    table = run_ok("submissions", "list", *APP, "Support", "cli", env=env)
    assert again["submission_id"] in table and "completed" in table
    inspected = json.loads(
        run_ok(
            "submissions",
            "inspect",
            *APP,
            "Support",
            "cli",
            again["submission_id"],
            "--json",
            env=env,
        )
    )
    assert inspected["status"] == "completed"
    missing = think_jobs("submissions", "inspect", *APP, "Support", "cli", "nope", env=env)
    assert missing.returncode == 1 and "no submission nope" in missing.stderr
    pruned = json.loads(run_ok("submissions", "prune", *APP, "Support", "cli", "--json", env=env))
    assert pruned == {"deleted": 1}


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_cancel_and_tail_commands(jobs: ThinkJobs, env: dict[str, str]) -> None:
    created = json.loads(run_ok("submit", *APP, "Support", "cli", "later", "--json", env=env))
    out = run_ok(
        "submissions",
        "cancel",
        *APP,
        "Support",
        "cli",
        created["submission_id"],
        "--reason",
        "nope",
        env=env,
    )
    assert out.strip() == f"{created['submission_id']}: aborted"
    tailed = run_ok(
        "tail",
        *APP,
        "Support",
        "cli",
        created["submission_id"],
        "--json",
        "--timeout",
        "5",
        env=env,
    )
    last = json.loads(tailed.strip().splitlines()[-1])
    assert last["done"] is True and last["status"] == "aborted" and last["error"] == "nope"
    agent = jobs.get_agent(Support, "cli")
    with worker_processes(env, count=1):
        result = agent.submit_messages(
            [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "x"}]}]
        )
        wait_for_status(agent, result.submission_id, "completed")
    replay = run_ok("tail", *APP, "Support", "cli", result.submission_id, "--timeout", "5", env=env)
    assert "Thanks, we are on it." in replay


def test_unknown_agent_type_is_a_one_line_error(env: dict[str, str]) -> None:
    result = think_jobs("submit", *APP, "Nobody", "x", "hi", env=env)
    assert result.returncode == 1
    assert 'AgentNotRegisteredError: unknown agent type "Nobody"' in result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture(params=["sigint-default", "sigint-ignored"])
def dev_process(
    env: dict[str, str], tmp_path: object, request: pytest.FixtureRequest
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """``think-jobs dev`` as a terminal starts it, and as a shell starts a command run with
    ``&`` (SIGINT inherited as ignored: before 2026-12-07 dev then never stopped on Ctrl-C,
    and reported its children, which did, as exiting unexpectedly)."""
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("THINK_JOBS_")}
    dev_env = {**clean, **env}
    ignored = request.param == "sigint-ignored"
    process = subprocess.Popen(
        [sys.executable, "-m", "think_jobs.cli", "dev", *APP, "--port", str(port), "-c", "1"],
        cwd=ROOT,
        env=dev_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignored else None,
    )
    try:
        yield process, port
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        assert process.stdout is not None
        process.stdout.close()


def _children_of(pid: int) -> set[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return {int(line) for line in found.stdout.split()}


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _pasted_env(process: subprocess.Popen[str]) -> dict[str, str]:
    """Read dev's output up to its "Press Ctrl-C" line; the ``export`` lines as a dict."""
    assert process.stdout is not None
    exports: dict[str, str] = {}
    for line in process.stdout:
        if line.strip().startswith("export "):
            name, _, value = line.strip().removeprefix("export ").partition("=")
            exports[name] = shlex.split(value, comments=True)[0]
        if "Press Ctrl-C" in line:
            return exports
    raise AssertionError(f"dev ended before announcing itself (exit {process.wait(10)})")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_dev_prints_a_block_another_terminal_can_paste_and_stops_cleanly(
    dev_process: tuple[subprocess.Popen[str], int], env: dict[str, str]
) -> None:
    process, port = dev_process
    pasted = _pasted_env(process)
    assert pasted["THINK_JOBS_REDIS_URL"] == env["THINK_JOBS_REDIS_URL"]
    assert pasted["THINK_JOBS_DATABASE_URL"] == env["THINK_JOBS_DATABASE_URL"]
    assert pasted["THINK_JOBS_APP"] == "tests.apps.agents:jobs"
    assert pasted["THINK_JOBS_API_TOKENS"]  # generated for this run (none was configured)
    wait_until(lambda: _healthy(port), 60, message=lambda: f"dev exited: {process.poll()}")
    other_terminal = think_jobs("submit", "Support", "dev", "Hello", "--follow", env=pasted)
    assert other_terminal.returncode == 0, other_terminal.stderr
    assert "Thanks, we are on it." in other_terminal.stdout
    children = _children_of(process.pid)
    assert len(children) >= 3  # worker, beat, web
    os.killpg(process.pid, signal.SIGINT)
    code = process.wait(60)
    assert process.stdout is not None
    assert code == 0, process.stdout.read()[-4000:]  # what dev and its children said last
    for child in children:
        with pytest.raises(ProcessLookupError):
            os.kill(child, 0)


def test_dev_refuses_an_explicit_redis_that_does_not_answer(env: dict[str, str]) -> None:
    unreachable = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    result = think_jobs("dev", *APP, env={**env, "THINK_JOBS_REDIS_URL": unreachable})
    assert result.returncode == 1
    port = unreachable.rsplit(":", 1)[1]
    assert f"THINK_JOBS_REDIS_URL=redis://:***@127.0.0.1:{port} does not answer" in result.stderr
    assert "hunter2" not in result.stderr + result.stdout and "Traceback" not in result.stderr
