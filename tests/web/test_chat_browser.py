"""The chat example (examples/chat: Vite + React + ``useChat({ resume: true })`` with the AI SDK's
``DefaultChatTransport``) in headless Chromium, against a live think-jobs: the example's Flask
app on a real port, a real worker, and the example's agent. Each test runs once per AI SDK
major the example builds (7, the current one, and 6).

Tool approvals (issue 18, part 2): the example's ``refund`` tool needs approval; the page's
Approve and Deny buttons call the SDK's ``addToolApprovalResponse`` and its
``sendAutomaticallyWhen`` POSTs the answer, which runs the continuation.

The agent is the example's, with one change for determinism: its reply stops after
``HOLD`` words until the test opens a gate (a Redis key), so "mid-stream" is a state the test
waits for, not a moment it hopes to hit.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from playwright.sync_api import Browser, Locator, Page, expect

from examples.chat.server import ASKING, NOT_REFUNDED, REFUNDED, Chat, create_app, reply_to
from tests.support.builders import texts, wait_for_status, wait_until
from tests.support.processes import ROOT
from tests.web.conftest import TEST_CONFIG
from tests.web.support import FULL_TOKEN, served
from think_jobs import ModelRequest, ThinkJobs
from think_jobs.testing import worker

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize(("sdk", "backend"), [("ai7", "postgres"), ("ai6", "sqlite")]),
]
HOLD = 4  # words of a reply sent before the gate
PATIENCE_MS = 30_000  # a loaded 2-core CI box runs 4 test processes plus their workers
MAJORS = {"ai7": "7", "ai6": "6"}


def gate_key(jobs: ThinkJobs) -> str:
    return f"{jobs.keys.prefix}:test-chat-gate"


class GatedModel:
    """The example's scripted reply, holding before word ``HOLD`` until the gate opens (or
    the turn is cancelled: the wait is on the turn's abort signal)."""

    def __init__(self, inner: Any, client: redis.Redis, key: str) -> None:
        self.inner, self.client, self.key = inner, client, key

    def stream(self, request: ModelRequest) -> Iterator[dict[str, Any]]:
        words = 0
        for chunk in self.inner.stream(request):
            if chunk.get("type") == "text-delta":
                if words == HOLD and not self._wait(request):
                    return
                words += 1
            yield chunk

    def _wait(self, request: ModelRequest) -> bool:
        while not self.client.exists(self.key):
            if request.signal.wait(0.02):
                return False
        return True


class GatedChat(Chat):
    agent_type = "Chat"  # the type the page talks to
    delay_s = 0.02

    def get_model(self) -> GatedModel:  # type: ignore[override]
        return GatedModel(super().get_model(), self.jobs.redis, gate_key(self.jobs))


def held(question: str) -> str:
    """What the page shows of a reply held at the gate."""
    return "".join(re.findall(r"\S+\s*", reply_to(question))[:HOLD]).strip()


def open_gate(jobs: ThinkJobs) -> None:
    jobs.redis.set(gate_key(jobs), 1)


@pytest.fixture(scope="session")
def chat_builds() -> Path:
    """The example built by the project's script (npm ci + vite build, cached by hash)."""
    subprocess.run([str(ROOT / "scripts" / "build-chat-example")], check=True)
    return ROOT / "examples" / "chat" / "dist"


@pytest.fixture
def chat_server(web_jobs: ThinkJobs, sdk: str, chat_builds: Path) -> Iterator[str]:
    """The example's app for ``sdk`` on a free loopback port (no worker yet)."""
    assert (chat_builds / sdk / "index.html").exists()
    web_jobs.register(GatedChat)
    app = create_app(web_jobs, build=sdk, config={**TEST_CONFIG, "TESTING": False})
    with served(app) as url:
        yield f"{url}/chat/"


@pytest.fixture
def chat_url(chat_server: str, web_jobs: ThinkJobs) -> Iterator[str]:
    """The example's app with a real worker running its turns."""
    with worker(web_jobs, concurrency=2):
        yield chat_server
        open_gate(web_jobs)  # nothing held past the test


def open_chat(browser: Browser, url: str, name: str, sdk: str) -> Page:
    page = browser.new_page()
    page.goto(f"{url}?agent={name}")
    page.fill("#token", FULL_TOKEN)
    page.get_by_role("button", name="Open the chat").click()
    expect(page.get_by_label("Message")).to_be_visible()
    expect(page.locator("#sdk-version")).to_have_text(re.compile(rf"^{MAJORS[sdk]}\.\d+\.\d+$"))
    return page


def say(page: Page, text: str) -> None:
    page.get_by_label("Message").fill(text)
    page.get_by_label("Message").press("Enter")


def replies(page: Page) -> Locator:
    return page.locator('[data-role="assistant"]')


def status_is(page: Page, chat: str, turn: str | None = None) -> None:
    expect(page.locator("#chat-status")).to_have_text(chat, timeout=PATIENCE_MS)
    if turn is not None:
        expect(page.locator("#turn-status")).to_have_text(turn, timeout=PATIENCE_MS)


def test_a_reply_streams_and_a_reload_mid_stream_resumes_it_without_duplicates(
    browser: Browser, chat_url: str, web_jobs: ThinkJobs, sdk: str
) -> None:
    page = open_chat(browser, chat_url, "resume", sdk)
    say(page, "hello")
    expect(replies(page)).to_have_text([held("hello")], timeout=PATIENCE_MS)  # part of it
    status_is(page, "streaming")
    page.reload()  # the POST's stream is gone; useChat reconnects at {api}/{id}/stream
    expect(page.locator('[data-role="user"]')).to_have_text(["hello"], timeout=PATIENCE_MS)
    expect(replies(page)).to_have_text([held("hello")], timeout=PATIENCE_MS)  # once
    status_is(page, "streaming")  # resumed: the turn is still running, held at the gate
    open_gate(web_jobs)
    expect(replies(page)).to_have_text([reply_to("hello")], timeout=PATIENCE_MS)
    status_is(page, "ready", "completed")
    agent = web_jobs.get_agent(GatedChat, "resume")
    assert texts(agent) == [("user", "hello"), ("assistant", reply_to("hello"))]
    expect(replies(page)).to_have_attribute("data-id", agent.get_messages()[1].id)


def test_a_reload_before_the_turn_starts_answers_its_stream_not_204(
    browser: Browser, chat_server: str, web_jobs: ThinkJobs, sdk: str
) -> None:
    open_gate(web_jobs)
    page = open_chat(browser, chat_server, "early", sdk)
    say(page, "are you there?")  # accepted; no worker runs it yet
    agent = web_jobs.get_agent(GatedChat, "early")
    wait_until(lambda: len(agent.list_submissions()) == 1)
    page.reload()
    status_is(page, "submitted")  # the reconnect got the waiting turn's stream, not a 204
    with worker(web_jobs, concurrency=2):
        expect(replies(page)).to_have_text([reply_to("are you there?")], timeout=PATIENCE_MS)
        status_is(page, "ready", "completed")
    page.reload()
    expect(page.locator("[data-role]")).to_have_text(["are you there?", reply_to("are you there?")])


def test_stop_keeps_the_partial_reply_and_aborts_the_turn(
    browser: Browser, chat_url: str, web_jobs: ThinkJobs, sdk: str
) -> None:
    page = open_chat(browser, chat_url, "stop", sdk)
    say(page, "never mind")
    expect(replies(page)).to_have_text([held("never mind")], timeout=PATIENCE_MS)
    page.get_by_role("button", name="Stop").click()
    status_is(page, "ready", "aborted")
    expect(replies(page)).to_have_text([held("never mind")])
    agent = web_jobs.get_agent(GatedChat, "stop")
    (submission,) = agent.list_submissions()
    wait_for_status(agent, submission.submission_id, "aborted")
    assert texts(agent)[1][1].strip() == held("never mind")  # the partial reply is stored
    page.reload()  # the stored partial reply, and nothing to resume (204)
    expect(replies(page)).to_have_text([held("never mind")], timeout=PATIENCE_MS)
    status_is(page, "ready")
    expect(page.get_by_role("button", name="Stop")).to_be_disabled()


def test_two_messages_sent_quickly_are_answered_in_order(
    browser: Browser, chat_url: str, web_jobs: ThinkJobs, sdk: str
) -> None:
    page = open_chat(browser, chat_url, "order", sdk)
    agent = web_jobs.get_agent(GatedChat, "order")
    say(page, "first")
    expect(replies(page)).to_have_text([held("first")], timeout=PATIENCE_MS)
    say(page, "second")  # while the first reply is still streaming
    wait_until(lambda: len(agent.list_submissions()) == 2)
    open_gate(web_jobs)
    answers = [reply_to("first"), reply_to("second")]
    expect(replies(page)).to_have_text(answers, timeout=PATIENCE_MS)
    status_is(page, "ready", "completed")
    asked = [("user", "first"), ("user", "second")]
    assert texts(agent) == [
        asked[0],
        ("assistant", answers[0]),
        asked[1],
        ("assistant", answers[1]),
    ]
    page.reload()  # the conversation as the server keeps it
    messages = page.locator("[data-role]")
    expect(messages).to_have_text(["first", answers[0], "second", answers[1]], timeout=PATIENCE_MS)


def test_regenerate_replaces_the_last_reply(
    browser: Browser, chat_url: str, web_jobs: ThinkJobs, sdk: str
) -> None:
    open_gate(web_jobs)
    page = open_chat(browser, chat_url, "again", sdk)
    say(page, "once more")
    expect(replies(page)).to_have_text([reply_to("once more")], timeout=PATIENCE_MS)
    status_is(page, "ready", "completed")
    first_id = replies(page).get_attribute("data-id")
    page.get_by_role("button", name="Regenerate").click()
    expect(replies(page)).not_to_have_attribute("data-id", first_id or "", timeout=PATIENCE_MS)
    expect(replies(page)).to_have_text([reply_to("once more")], timeout=PATIENCE_MS)
    status_is(page, "ready", "completed")
    agent = web_jobs.get_agent(GatedChat, "again")
    stored = agent.get_messages()
    assert [m.role for m in stored] == ["user", "assistant"] and stored[1].id != first_id
    expect(replies(page)).to_have_attribute("data-id", stored[1].id)
    regenerated = agent.list_submissions()[0]
    assert regenerated.metadata == {"source": "chat", "trigger": "regenerate-message"}
    assert regenerated.status == "completed"


def refund_asked(browser: Browser, url: str, web_jobs: ThinkJobs, name: str, sdk: str) -> Page:
    """A chat whose reply stopped at the refund call, waiting for approval (after a reload:
    the waiting call comes back with the stored messages, and nothing is resumed)."""
    open_gate(web_jobs)
    page = open_chat(browser, url, name, sdk)
    say(page, "please refund my order")
    tool = page.locator('[data-tool="tool-refund"]')
    expect(tool).to_have_attribute("data-tool-state", "approval-requested", timeout=PATIENCE_MS)
    status_is(page, "ready", "completed")
    page.reload()
    expect(tool).to_have_attribute("data-tool-state", "approval-requested", timeout=PATIENCE_MS)
    status_is(page, "ready")
    return page


def test_approve_runs_the_tool_and_the_reply_goes_on(
    browser: Browser, chat_url: str, web_jobs: ThinkJobs, sdk: str
) -> None:
    page = refund_asked(browser, chat_url, web_jobs, "refund-yes", sdk)
    agent = web_jobs.get_agent(GatedChat, "refund-yes")
    (approval,) = agent.list_approvals(status="pending")
    tool = page.locator('[data-tool="tool-refund"]')
    tool.get_by_role("button", name="Approve").click()
    expect(tool).to_have_attribute("data-tool-state", "output-available", timeout=PATIENCE_MS)
    expect(replies(page).locator(".text")).to_have_text([ASKING + REFUNDED], timeout=PATIENCE_MS)
    status_is(page, "ready", "completed")
    assert agent.get_approval(approval.approval_id).status == "approved"  # type: ignore[union-attr]
    wait_for_status(agent, approval.continuation_id, "completed")
    assert texts(agent) == [("user", "please refund my order"), ("assistant", ASKING + REFUNDED)]
    page.reload()
    expect(tool).to_have_attribute("data-tool-state", "output-available", timeout=PATIENCE_MS)


def test_deny_tells_the_model_and_the_tool_never_runs(
    browser: Browser, chat_url: str, web_jobs: ThinkJobs, sdk: str
) -> None:
    page = refund_asked(browser, chat_url, web_jobs, "refund-no", sdk)
    agent = web_jobs.get_agent(GatedChat, "refund-no")
    tool = page.locator('[data-tool="tool-refund"]')
    tool.get_by_role("button", name="Deny").click()
    expect(tool).to_have_attribute("data-tool-state", "output-denied", timeout=PATIENCE_MS)
    expect(replies(page).locator(".text")).to_have_text(
        [ASKING + NOT_REFUNDED], timeout=PATIENCE_MS
    )
    status_is(page, "ready", "completed")
    (closed,) = agent.list_approvals()
    assert (closed.status, closed.reason) == ("denied", "denied in the chat")
