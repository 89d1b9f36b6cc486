"""gunicorn with two workers and web.gunicorn_conf, as docker-compose.yml runs it: a scrape of
/metrics adds up what every worker counted (PROMETHEUS_MULTIPROC_DIR)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.support.builders import user, wait_until
from tests.support.processes import free_port
from tests.web.support import FULL, FULL_TOKEN, SECRET_KEY
from tests.web.test_processes import Server, serving

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("backend", ["sqlite"], indirect=True)]
ACCEPTED = re.compile(
    r'^think_jobs_submissions_total\{agent_type="Support",outcome="accepted"\} (\S+)$', re.M
)


def _counter_files(directory: Path) -> set[str]:
    return {p.name for p in directory.glob("counter_*.db")}


def _submit(server: Server, n: int) -> None:
    status, body = server.request(
        "POST", "/api/agents/Support/metrics/submissions", {"messages": [user(f"m{n}")]}, FULL
    )
    assert status == 202, body


def test_two_gunicorn_workers_add_up_their_counters(
    settings_env: dict[str, str], tmp_path: Path
) -> None:
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    (metrics_dir / "stale.db").write_text("left from an earlier run")
    env = {
        **settings_env,
        "THINK_JOBS_API_TOKENS": FULL_TOKEN,
        "THINK_JOBS_SECRET_KEY": SECRET_KEY,
        "THINK_JOBS_APP": "tests.apps.agents:jobs",
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
    }
    port = free_port()
    command = [sys.executable, "-m", "gunicorn", "-c", "python:web.gunicorn_conf", "-w", "2",
               "-b", f"127.0.0.1:{port}", "web:create_app()"]  # fmt: skip
    with serving(command, env, port) as server:
        assert not (metrics_dir / "stale.db").exists()  # on_starting wiped the directory
        sent = 0

        def both_workers_counted() -> bool:
            nonlocal sent
            _submit(server, sent)
            sent += 1
            return len(_counter_files(metrics_dir)) >= 2 or sent >= 200

        wait_until(both_workers_counted, message=lambda: str(_counter_files(metrics_dir)))
        assert len(_counter_files(metrics_dir)) >= 2, "one worker answered every request"
        status, text = server.request("GET", "/metrics", headers=FULL)
        assert status == 200
    found = ACCEPTED.search(text.decode() if isinstance(text, bytes) else text)
    assert found is not None and float(found.group(1)) == sent
