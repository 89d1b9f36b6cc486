"""One logging switch for every process (issue 16): with THINK_JOBS_LOG_JSON=true and the
default THINK_JOBS_LOG_LEVEL, the web app under gunicorn and a worker write one JSON object
per line for a submission's whole life, each record with the fields the docs list."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from tests.support.builders import user, wait_until
from tests.support.processes import WorkerProcess, free_port
from tests.web.support import FULL, FULL_TOKEN, SECRET_KEY
from tests.web.test_processes import serving

FIELDS = {"agent", "agent_type", "agent_name", "submission_id", "request_id", "attempt", "trigger"}


def records(lines: list[str]) -> list[dict[str, Any]]:
    """The JSON log records among a process's output lines (banners are plain text)."""
    found = []
    for line in lines:
        text = line.strip()
        if text.startswith("{"):
            found.append(json.loads(text))
    return found


def of(found: list[dict[str, Any]], message: str) -> list[dict[str, Any]]:
    return [record for record in found if record["message"] == message]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_the_web_app_and_a_worker_log_a_submissions_whole_life_as_json(
    settings_env: dict[str, str],
) -> None:
    env = {
        **settings_env,
        "THINK_JOBS_LOG_JSON": "true",
        "THINK_JOBS_API_TOKENS": FULL_TOKEN,
        "THINK_JOBS_SECRET_KEY": SECRET_KEY,
        "THINK_JOBS_APP": "tests.apps.agents:jobs",
    }
    port = free_port()
    command = [sys.executable, "-m", "gunicorn", "-w", "1", "-b", f"127.0.0.1:{port}"]
    worker = WorkerProcess(env, app="tests.apps.agents:jobs", concurrency=1, pool="threads")
    path = "/api/agents/Support/logs/submissions"
    body = {"messages": [user("Hi")], "idempotency_key": "delivery-1"}
    with serving([*command, "web:create_app()"], env, port) as web:
        worker.wait_ready()
        status, created = web.request("POST", path, body, FULL)
        assert status == 202, created
        again, _ = web.request("POST", path, body, FULL)
        assert again == 200
        submission_id = created["submission_id"]

        def finished() -> bool:
            return bool(of(records(worker.output), "turn finished"))

        wait_until(finished, message=lambda: "".join(worker.output[-20:]))
        worker.stop()
    web_records = records(web.output)
    accepted = of(web_records, "submission accepted")
    duplicate = of(web_records, "submission duplicate")
    assert len(accepted) == len(duplicate) == 1, web.describe()
    turn_records = of(records(worker.output), "turn started") + of(
        records(worker.output), "turn finished"
    )
    assert len(turn_records) == 2
    for record in [*accepted, *duplicate, *turn_records]:
        assert set(record) >= FIELDS, record
        assert record["submission_id"] == record["request_id"] == submission_id
        assert record["agent"] == "Support:logs" and record["trigger"] == "submission"
        assert {"time", "level", "logger"} <= set(record)
    assert of(records(worker.output), "turn finished")[0]["status"] == "completed"
