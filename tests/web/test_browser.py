"""End to end in a real browser (Debian's chromium, headless, driven by Playwright): log in,
submit through the API, watch the detail page render the stream live, cancel a slow turn.

Screenshots go to $TJ_SCREENSHOT_DIR when set (``TJ_SCREENSHOT_DIR=docs`` refreshes the ones
the README shows); none are taken otherwise.
"""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask
from playwright.sync_api import Browser, Page, expect

from tests.support.builders import directive
from tests.web.support import FULL, FULL_TOKEN, screenshot
from think_jobs import ThinkJobs
from think_jobs.testing import worker

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("backend", ["postgres"])]
WORDS = " ".join(f"word{i}" for i in range(12))


def submit(app_client: object, name: str, **spec: Any) -> str:
    response = app_client.post(  # type: ignore[attr-defined]
        f"/api/agents/Recorder/{name}/submissions",
        headers=FULL,
        json={"messages": [directive(**spec)]},
    )
    assert response.status_code == 202
    return str(response.json["submission_id"])


def test_log_in_watch_a_turn_stream_live_and_cancel_a_slow_one(
    base_url: str, browser: Browser, web_jobs: ThinkJobs, app: Flask
) -> None:
    page = browser.new_page(viewport={"width": 1200, "height": 760})
    page.goto(f"{base_url}/admin/")
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    page.fill("#tj-token", FULL_TOKEN)
    page.click("button[type=submit]")
    expect(page.get_by_role("heading", name="Agents")).to_be_visible()

    api = app.test_client()
    finished = submit(api, "support-42", label="live", text=WORDS, delay_s=0.05)
    slow = submit(api, "support-7", label="slow", text=WORDS, stall_after=3)
    page.goto(f"{base_url}/admin/agents/Recorder/support-42/requests/{finished}")
    expect(page.locator(".tj-status").first).to_have_text("pending")
    assert page.locator("#tj-output").inner_text() == ""  # nothing rendered by the server yet

    with worker(web_jobs, concurrency=2):
        expect(page.locator("#tj-output")).to_contain_text("word3")  # arriving over SSE
        expect(page.locator("#tj-output")).to_have_text(WORDS, timeout=30_000)
        expect(page.locator(".tj-status").first).to_have_text("completed")
        expect(page.get_by_role("button", name="Cancel")).to_be_hidden()
        page.reload()  # the server's record of the finished turn
        expect(page.get_by_role("button", name="Delete")).to_be_visible()
        expect(page.locator("#tj-output")).to_have_text(WORDS)
        screenshot(page, "admin-detail.png")

        page.goto(f"{base_url}/admin/agents/Recorder/support-7/requests/{slow}")
        expect(page.locator("#tj-output")).to_have_text("word0 word1 word2 ", timeout=30_000)
        expect(page.locator(".tj-status").first).to_have_text("running")
        page.get_by_role("button", name="Cancel").click()
        expect(page.locator(".tj-status").first).to_have_text("aborted")
        expect(page.get_by_text("Cancel requested for")).to_be_visible()
        assert "word3" not in page.locator("#tj-output").inner_text()

    take_overview_shots(page, base_url)


def take_overview_shots(page: Page, base_url: str) -> None:
    page.goto(f"{base_url}/admin/")
    expect(page.get_by_role("link", name="support-42")).to_be_visible()
    screenshot(page, "admin-agents.png")
    page.goto(f"{base_url}/admin/agents/Recorder/support-7/")
    expect(page.locator(".tj-status-aborted").first).to_be_visible()
    screenshot(page, "admin-submissions.png")
