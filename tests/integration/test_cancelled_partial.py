"""A running turn cancelled while its attempt cannot write keeps what it streamed (SPEC §5: a
cancelled running turn keeps its partial reply), against a real worker killed mid-stream,
PostgreSQL and Redis.

The attempt that would store its partial when the cancel reaches it is dead, and no recovery
follows a cancel: the worker that next takes the agent's lease over from the lapsed one stores
the partial the stream shows, before the agent's next turn applies its messages. Before
2026-12-06 evening the cancelled turn kept the partial stored before its attempt began —
here none — while a client had read every word its stream carried.
"""

from __future__ import annotations

import pytest

from tests.apps.agents import Recorder, read_events
from tests.support.builders import directive, wait_for_status
from tests.support.processes import worker_processes
from think_jobs import ThinkJobs
from think_jobs.messages import message_text
from think_jobs.replay import assemble
from think_jobs.testing import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("backend", ["postgres"], indirect=True)]


def test_a_turn_cancelled_after_its_worker_died_keeps_what_it_streamed(
    fault_jobs: ThinkJobs, fault_env: dict[str, str]
) -> None:
    agent = fault_jobs.get_agent(Recorder, "cancelled")
    text = " ".join(f"w{i}" for i in range(200))
    first = agent.submit_messages([directive("m-1", label="a", text=text, delay_s=0.05)])
    with worker_processes(fault_env, count=1) as [dying]:
        wait_until(lambda: _chunks(fault_jobs, "a") >= 10, 60, interval_s=0.02)
        dying.kill()
    agent.cancel_submission(first.submission_id, reason="the user stopped it")
    streamed = list(agent.stream(first.submission_id, timeout_s=30))  # a client reads it now
    second = agent.submit_messages([directive("m-2", label="b", text="after")])
    with worker_processes(fault_env, count=1):
        wait_for_status(agent, second.submission_id, "completed")
    found = agent.inspect_submission(first.submission_id)
    assert found is not None and (found.status, found.error) == ("aborted", "the user stopped it")
    assert streamed[-1].done and streamed[-1].status == "aborted"
    chunks = [event.chunk for event in streamed if event.chunk is not None]
    messages = agent.get_messages()
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    partial = messages[1]  # in its place: before the next turn's message
    shown = assemble(chunks, partial.id)
    assert message_text(shown).startswith("w0 w1 w2 w3 w4 w5")
    assert shown.parts == partial.parts  # what the client read is what the agent keeps
    assert (messages[0].id, messages[2].id, message_text(messages[3])) == ("m-1", "m-2", "after")


def _chunks(jobs: ThinkJobs, label: str) -> int:
    return sum(1 for e in read_events(jobs) if e["what"] == "chunk" and e["label"] == label)
