"""A turn's hooks run inside the turn (SPEC §6: "a slow hook delays the next turn"): after its
final write the attempt keeps renewing its lease for as long as ``on_chat_response`` runs, so
the agent's next turn starts only once it returned, however long past the lease TTL. Only the
turn's time limit bounds a hook that never returns: a lease TTL after the limit the lease
lapses and the agent goes on (the stored outcome stays the one the final write made)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from tests.support.builders import user, wait_for_status
from think_jobs import ChatResponseResult, Think, ThinkJobs
from think_jobs.messages import message_text
from think_jobs.models import ModelRequest, Reply, ScriptedModel
from think_jobs.testing import worker

EVENTS: list[tuple[str, float]] = []  # what happened, when (this process's monotonic clock)
HOOK_RELEASE = threading.Event()
SLOW_HOOK_S = 4.0  # past four lease TTLs of 1 s: long enough for a lapsed lease to show


def _answer(request: ModelRequest) -> Reply:
    """Answers with the last user message's text, noting when it was called."""
    text = message_text(request.messages[-1])
    EVENTS.append((f"model {text}", time.monotonic()))
    return Reply(text=text)


class SlowHook(Think):
    """``on_chat_response`` takes four seconds after the turn asked ``slow``."""

    def get_model(self) -> ScriptedModel:
        return ScriptedModel(_answer)

    def on_chat_response(self, result: ChatResponseResult) -> None:
        if result.message is not None and message_text(result.message) == "slow":
            EVENTS.append(("hook began", time.monotonic()))
            time.sleep(SLOW_HOOK_S)  # the slow hook itself, not a wait for something
            EVENTS.append(("hook ended", time.monotonic()))


class HungHook(Think):
    """``on_chat_response`` never returns after ``hang`` (until the test ends); two-second
    time limit."""

    turn_timeout_s = 2.0

    def get_model(self) -> ScriptedModel:
        return ScriptedModel(_answer)

    def on_chat_response(self, result: ChatResponseResult) -> None:
        if result.message is not None and message_text(result.message) == "hang":
            assert HOOK_RELEASE.wait(60), "the test never let the hook go"


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    EVENTS.clear()
    HOOK_RELEASE.clear()
    try:
        yield
    finally:
        HOOK_RELEASE.set()


def test_a_hook_slower_than_the_lease_delays_the_next_turn(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    jobs = make_jobs(lease_ttl_s=1.0, sweep_interval_s=0.5)
    agent = jobs.get_agent(SlowHook, "s")
    slow = agent.submit_messages([user("slow")])
    after = agent.submit_messages([user("after")])
    with worker(jobs, concurrency=2):
        wait_for_status(agent, after.submission_id, "completed")
    assert [what for what, _ in EVENTS] == ["model slow", "hook began", "hook ended", "model after"]
    found = agent.inspect_submission(slow.submission_id)
    assert found is not None and (found.status, found.attempt) == ("completed", 1)


def test_the_time_limit_bounds_a_hook_that_never_returns(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    jobs = make_jobs(lease_ttl_s=1.0, sweep_interval_s=0.5)
    agent = jobs.get_agent(HungHook, "h")
    hung = agent.submit_messages([user("hang")])
    after = agent.submit_messages([user("after")])
    with worker(jobs, concurrency=2):
        wait_for_status(agent, after.submission_id, "completed")
        assert not HOOK_RELEASE.is_set()  # the hook still hangs: the agent went on without it
        HOOK_RELEASE.set()
    found = agent.inspect_submission(hung.submission_id)
    assert found is not None and (found.status, found.error) == ("completed", None)
    assert [m.role for m in agent.get_messages()] == ["user", "assistant", "user", "assistant"]
