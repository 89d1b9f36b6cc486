"""The app under gunicorn: 2 workers x 4 threads serve 20 concurrent SSE streams and API calls.
(``think-jobs dev``, which prints a generated token, is covered by tests/acceptance.)"""

from __future__ import annotations

import http.client
import json
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.apps.agents import Recorder
from tests.support.builders import directive
from tests.support.processes import ManagedProcess, free_port
from tests.web.support import FULL, FULL_TOKEN, SECRET_KEY, sse_events, stream_text
from think_jobs import ThinkJobs
from think_jobs.testing import wait_until, worker

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("backend", ["postgres"])]
STREAMS = 20


class Server(ManagedProcess):
    """A server subprocess on a free port; its output is kept for failure messages."""

    def __init__(self, command: list[str], env: dict[str, str], port: int) -> None:
        super().__init__(command, env, ready_marker="")
        self.port = port

    def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            payload = None if body is None else json.dumps(body)
            sent = {**(headers or {}), **({"Content-Type": "application/json"} if body else {})}
            connection.request(method, path, body=payload, headers=sent)
            response = connection.getresponse()
            data = response.read()
            is_json = response.getheader("Content-Type", "").startswith("application/json")
            return response.status, json.loads(data) if is_json else data
        finally:
            connection.close()

    def up(self) -> bool:
        try:
            return self.request("GET", "/healthz")[0] == 200
        except OSError:
            return False

    def describe(self) -> str:
        return "".join(self.output[-30:])


@contextmanager
def serving(command: list[str], env: dict[str, str], port: int) -> Iterator[Server]:
    server = Server(command, env, port)
    try:
        wait_until(server.up, 30, message=server.describe)
        yield server
    finally:
        server.stop()


def read_stream(server: Server, path: str) -> list[Any]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        connection.request("GET", path, headers=FULL)
        response = connection.getresponse()
        assert response.status == 200, response.read()
        assert response.getheader("x-vercel-ai-ui-message-stream") == "v1"
        events = []
        for event in sse_events(iter(lambda: response.read1(65536), b"")):
            events.append(event)
            if event.data == "[DONE]":
                return events
        raise AssertionError(f"stream {path} ended without [DONE]")
    finally:
        connection.close()


def test_gunicorn_two_workers_four_threads_serve_twenty_streams_and_api_calls(
    make_jobs: Callable[..., ThinkJobs], settings_env: dict[str, str]
) -> None:
    jobs = make_jobs()
    jobs.register(Recorder)
    port = free_port()
    env = {
        **settings_env,
        "THINK_JOBS_API_TOKENS": FULL_TOKEN,
        "THINK_JOBS_SECRET_KEY": SECRET_KEY,
        "THINK_JOBS_APP": "tests.apps.agents:jobs",
        "FLASK_THINK_JOBS_SSE_HEARTBEAT_S": "1.0",
    }
    options = ["-w", "2", "-k", "gthread", "--threads", "4", "--log-level", "warning"]
    command = [sys.executable, "-m", "gunicorn", *options, "-b", f"127.0.0.1:{port}"]
    command.append("web:create_app()")
    with serving(command, env, port) as server:
        ids = []
        for i in range(STREAMS):
            words = " ".join(f"a{i}w{n}" for n in range(15))
            status, body = server.request(
                "POST",
                f"/api/agents/Recorder/agent-{i}/submissions",
                {"messages": [directive(label=str(i), text=words, delay_s=0.01)]},
                FULL,
            )
            assert status == 202, body
            ids.append((i, body["submission_id"], words))
        results: dict[int, Any] = {}
        calls: list[int] = []

        def follow(i: int, submission_id: str) -> None:
            path = f"/api/agents/Recorder/agent-{i}/requests/{submission_id}/stream"
            results[i] = read_stream(server, path)

        def poll() -> None:
            for i in range(STREAMS):
                calls.append(
                    server.request(
                        "GET", f"/api/agents/Recorder/agent-{i}/submissions", headers=FULL
                    )[0]
                )
                calls.append(server.request("GET", "/api/agents", headers=FULL)[0])

        threads = [threading.Thread(target=follow, args=(i, s)) for i, s, _ in ids]
        threads += [threading.Thread(target=poll) for _ in range(2)]
        for thread in threads:
            thread.start()
        with worker(jobs, concurrency=4):
            for thread in threads:
                thread.join(120)
        assert not any(t.is_alive() for t in threads), server.describe()
    assert calls == [200] * (4 * STREAMS)
    for i, _submission_id, words in ids:
        events = results[i]
        assert stream_text(events) == words
        seqs = [int(e.id) for e in events if e.id is not None]
        assert seqs == list(range(len(seqs)))
        assert json.loads(events[-2].data)["data"]["status"] == "completed"
    assert "Traceback" not in server.describe(), server.describe()
