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
CLEAR_TRIED = threading.Event()
CLEAR_RAISED: list[BaseException] = []
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


def _answer_when_cleared(request: ModelRequest) -> Reply:
    """Answers ``after`` only once the hung hook tried its clear (the turn runs meanwhile)."""
    if message_text(request.messages[-1]) == "after":
        assert CLEAR_TRIED.wait(60), "the hung hook never tried its clear"
    return _answer(request)


class HungHookClears(Think):
    """After ``hang``, ``on_chat_response`` hangs past its two-second time limit (its lease
    lapses and the agent's next turn starts elsewhere), then calls ``clear_messages``."""

    turn_timeout_s = 2.0

    def get_model(self) -> ScriptedModel:
        return ScriptedModel(_answer_when_cleared)

    def on_chat_response(self, result: ChatResponseResult) -> None:
        if result.message is None or message_text(result.message) != "hang":
            return
        assert HOOK_RELEASE.wait(60), "the test never let the hook go"
        try:
            self.clear_messages()
        except BaseException as error:
            CLEAR_RAISED.append(error)
            raise
        finally:
            CLEAR_TRIED.set()


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    EVENTS.clear()
    HOOK_RELEASE.clear()
    CLEAR_TRIED.clear()
    CLEAR_RAISED.clear()
    try:
        yield
    finally:
        HOOK_RELEASE.set()
        CLEAR_TRIED.set()


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


def test_a_hook_that_lost_its_lease_cannot_reset_the_agent(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    """A hook still running after its lease lapsed (hung, or its worker paused past the TTL)
    is no longer inside the agent's turn: the agent's next turn runs elsewhere. Its
    ``clear_messages`` is refused (``LeaseLost``, nothing changed) instead of aborting that
    next turn and deleting its conversation."""
    jobs = make_jobs(lease_ttl_s=1.0, sweep_interval_s=0.5)
    agent = jobs.get_agent(HungHookClears, "c")
    hung = agent.submit_messages([user("hang")])
    after = agent.submit_messages([user("after")])
    with worker(jobs, concurrency=2):
        wait_for_status(agent, after.submission_id, "running")  # the lapsed lease was taken
        HOOK_RELEASE.set()
        ended = wait_for_status(agent, after.submission_id, "completed", "aborted")
    assert [type(error).__name__ for error in CLEAR_RAISED] == ["LeaseLost"]
    assert (ended.status, ended.error) == ("completed", None)
    found = agent.inspect_submission(hung.submission_id)
    assert found is not None and found.status == "completed"
    texts = [(m.role, message_text(m)) for m in agent.get_messages()]
    assert texts == [
        ("user", "hang"),
        ("assistant", "hang"),
        ("user", "after"),
        ("assistant", "after"),
    ]
