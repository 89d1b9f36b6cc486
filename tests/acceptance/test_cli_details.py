"""The command line's answers to mistakes (issue 16): one line, the right words, nothing
changed; and ``think-jobs workers`` / ``submissions inspect`` saying why a turn waits."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.acceptance.test_cli import think_jobs
from tests.apps.agents import Support
from tests.support.builders import user, wait_until
from tests.support.processes import ManagedProcess, free_port, think_jobs_command, worker_processes
from think_jobs import ThinkJobs

APP = ["--app", "tests.apps.agents:jobs"]
FAST = {"THINK_JOBS_WORKER_HEARTBEAT_INTERVAL_S": "0.2"}


@pytest.fixture
def env(settings_env: dict[str, str]) -> dict[str, str]:
    return {**settings_env, **FAST}


def test_version() -> None:
    result = think_jobs("--version", env={})
    assert result.returncode == 0
    assert result.stdout.startswith("think-jobs, version ")


def test_worker_help_has_no_literal_markup() -> None:
    result = think_jobs("worker", "--help", env={})
    assert result.returncode == 0 and "``" not in result.stdout


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_bounds_are_validated_and_a_refused_prune_deletes_nothing(
    jobs: ThinkJobs, env: dict[str, str]
) -> None:
    agent = jobs.get_agent(Support, "bounds")
    done = agent.submit_messages([user("x")])
    agent.cancel_submission(done.submission_id, "stop")  # terminal: a prune could delete it
    for limit in ("0", "-1", "101"):
        result = think_jobs(
            "submissions", "list", *APP, "Support", "bounds", "--limit", limit, env=env
        )
        assert result.returncode == 2 and "1<=x<=100" in result.stderr, limit
    refused = think_jobs(
        "submissions", "prune", *APP, "Support", "bounds", "--older-than-days", "-5", env=env
    )
    assert refused.returncode == 2 and "x>=0" in refused.stderr
    assert agent.inspect_submission(done.submission_id) is not None


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_an_empty_message_is_refused_and_nothing_is_stored(
    jobs: ThinkJobs, env: dict[str, str]
) -> None:
    for text in ("", "   "):
        result = think_jobs("submit", *APP, "Support", "empty", text, env=env)
        assert result.returncode == 2 and "the message is empty" in result.stderr
    assert jobs.get_agent(Support, "empty").list_submissions() == []


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    "command",
    [
        ["submit", "Support", "a", "hi"],
        ["tail", "Support", "a"],
        ["submissions", "list", "Support", "a"],
        ["schedules", "run", "Support", "a", "daily"],
    ],
)
def test_commands_that_name_an_agent_type_say_when_there_is_no_app(
    env: dict[str, str], command: list[str]
) -> None:
    result = think_jobs(*command, env=env)
    assert result.returncode == 2
    assert "no --app given (and THINK_JOBS_APP is not set)" in result.stderr
    assert "registered: none" not in result.stderr


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_tail_of_an_unknown_request_says_no_such_request(env: dict[str, str]) -> None:
    result = think_jobs("tail", *APP, "Support", "t", "nope", "--timeout", "30", env=env)
    assert result.returncode == 1
    assert "no such request nope for agent Support:t" in result.stderr


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("not a url", "the database URL (THINK_JOBS_DATABASE_URL) is not a URL"),
        ("mysql://me:pw@db.invalid/x", "database URL mysql://me:***@db.invalid/x: its driver"),
        ("nosuchdb://x/y", "SQLAlchemy knows no database 'nosuchdb'"),
    ],
)
def test_a_bad_database_url_is_one_line(url: str, expected: str) -> None:
    result = think_jobs("db", "upgrade", env={"THINK_JOBS_DATABASE_URL": url})
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert expected in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_worker_without_app_warns_and_inspect_says_why_the_turn_waits(
    jobs: ThinkJobs, env: dict[str, str]
) -> None:
    agent = jobs.get_agent(Support, "waits")
    pending = agent.submit_messages([user("anyone?")])
    name = f"bare-{uuid.uuid4().hex[:8]}@test"
    bare = ManagedProcess(
        think_jobs_command("worker", "-l", "INFO", "-n", name, "--without-mingle",
                           "--without-gossip", "--without-heartbeat"),
        env,
        ready_marker=" ready.",
    )  # fmt: skip
    try:
        bare.wait_ready()
        assert bare.lines("this worker serves no agent types")
        listed = wait_until(lambda: _listed(env, name))
        assert listed["agent_types"] == [] and listed["queues"] == [env["THINK_JOBS_QUEUE"]]
        table = think_jobs("workers", env=env)
        assert name in table.stdout and "none (no --app?)" in table.stdout
        shown = think_jobs(
            "submissions", "inspect", *APP, "Support", "waits", pending.submission_id, env=env
        )
        assert "pending: no live worker serves agent type Support" in shown.stdout
    finally:
        bare.stop()
    assert _listed(env, name) is None  # a stopped worker removes its record


def _listed(env: dict[str, str], name: str) -> dict[str, object] | None:
    result = think_jobs("workers", "--json", env=env)
    assert result.returncode == 0, result.stderr
    found = [item for item in json.loads(result.stdout) if item["name"] == name]
    return found[0] if found else None


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_workers_lists_a_serving_worker_and_check_finds_it(env: dict[str, str]) -> None:
    with worker_processes(env, count=1, concurrency=3):
        listed = wait_until(
            lambda: json.loads(think_jobs("workers", "--json", *APP, env=env).stdout)
        )
        (record,) = listed
        assert record["role"] == "worker" and record["concurrency"] == 3
        assert (
            record["agent_types"] == sorted(record["agent_types"])
            and "Support" in record["agent_types"]
        )
        checked = think_jobs("workers", "--check", record["name"], env=env)
        assert checked.returncode == 0 and "is live" in checked.stdout
    missing = think_jobs("workers", "--check", "nobody@nowhere", env=env)
    assert (
        missing.returncode == 1 and "no live worker or beat named nobody@nowhere" in missing.stderr
    )


def test_a_worker_that_cannot_reach_its_database_says_so(env: dict[str, str]) -> None:
    down = {**env, "THINK_JOBS_DATABASE_URL": f"postgresql+psycopg://x@127.0.0.1:{free_port()}/x"}
    process = ManagedProcess(
        think_jobs_command("worker", *APP, "-l", "INFO", "-n", f"nodb-{uuid.uuid4().hex[:6]}@t",
                           "--without-mingle", "--without-gossip", "--without-heartbeat"),
        down,
        ready_marker=" ready.",
    )  # fmt: skip
    try:
        process.wait_ready()
        assert process.lines("this worker cannot reach its database")
    finally:
        process.stop()
