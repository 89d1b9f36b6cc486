"""Issue 10: the admin dashboard. Its queries against real SQLite and PostgreSQL, on turns made
through the API and run by a real worker, then moved in time (their timestamps rewritten) to
build an hour of history; the stuck-turn rule; the page; the charts; and the page in a real
browser (screenshot: ``TJ_SCREENSHOT_DIR=docs`` refreshes ``docs/admin-dashboard.png``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from xml.etree import ElementTree

import pytest
from flask import Flask
from flask.testing import FlaskClient
from playwright.sync_api import Browser, expect
from sqlalchemy import update

from tests.apps.agents import Recorder
from tests.support.builders import directive, wait_for_status
from tests.web.conftest import TEST_CONFIG
from tests.web.support import FULL, READ_TOKEN, log_in, screenshot
from think_jobs import ThinkJobs
from think_jobs.context import utcnow
from think_jobs.db import dashboard as queries
from think_jobs.db.tables import turns
from think_jobs.reports import StuckRule
from think_jobs.testing import worker
from web import create_app
from web.charts import Axis, Chart, Series, bar_chart, line_chart, nice, scale

M = timedelta(minutes=1)
S = timedelta(seconds=1)


class Night(Recorder):
    """Another agent type with the same steerable model, and no completed turns of its own."""


@dataclass
class History:
    """The turns of an hour, by role; ``now`` is the instant their timestamps are relative to."""

    now: datetime
    ids: dict[str, str] = field(default_factory=dict)


def submit(api: FlaskClient, agent_type: str, name: str, **spec: Any) -> str:
    response = api.post(
        f"/api/agents/{agent_type}/{name}/submissions",
        headers=FULL,
        json={"messages": [directive(**spec)]},
    )
    assert response.status_code == 202, response.json
    return str(response.json["submission_id"])  # type: ignore[index]


def move(
    jobs: ThinkJobs,
    request_id: str,
    created: datetime,
    started: datetime | None = None,
    completed: datetime | None = None,
) -> None:
    """Put a turn at another point in time (only its timestamps change)."""
    values = {"created_at": created, "started_at": started, "completed_at": completed}
    with jobs.db.write() as conn:
        conn.execute(update(turns).where(turns.c.request_id == request_id).values(**values))


def finished(api: FlaskClient, jobs: ThinkJobs, extra: int) -> dict[str, tuple[str, str, str]]:
    """Turns that will complete: role -> (agent type, agent name, submission id)."""
    made = {f"quick-{i}": ("Support", f"quick-{i}") for i in range(5)}
    made |= {role: ("Recorder", f"r-{role}") for role in ("a", "b", "c", "old")}
    made |= {f"extra-{k}": ("Support", f"busy-{k % 4}") for k in range(extra)}
    return {role: (t, n, submit(api, t, n, label=role)) for role, (t, n) in made.items()}


def wait_all(jobs: ThinkJobs, made: dict[str, tuple[str, str, str]], *statuses: str) -> None:
    for agent_type, name, submission_id in made.values():
        wait_for_status(jobs.get_agent(agent_type, name), submission_id, *statuses)


@contextmanager
def an_hour_of_history(app: Flask, jobs: ThinkJobs, *, extra: int = 0) -> Iterator[History]:
    """Real turns, run by a real worker, then placed in the last hour (see ``expected_depth``).

    Three turns stay running (stalled) and two pending behind them until the block ends.
    """
    api = app.test_client()
    done = finished(api, jobs, extra)
    with worker(jobs, concurrency=4):
        wait_all(jobs, done, "completed")
        stalled = {
            "stuck-a": ("Recorder", "stuck-a", submit(api, "Recorder", "stuck-a", stall_after=1)),
            "slow-b": ("Recorder", "slow-b", submit(api, "Recorder", "slow-b", stall_after=1)),
            "night": ("Night", "night-1", submit(api, "Night", "night-1", stall_after=1)),
        }
        wait_all(jobs, stalled, "running")
        history = History(utcnow(), {role: ids[2] for role, ids in {**done, **stalled}.items()})
        history.ids["waiting"] = submit(api, "Recorder", "stuck-a", label="waiting")
        history.ids["behind"] = submit(api, "Night", "night-1", label="behind")
        history.ids["dropped"] = submit(api, "Recorder", "slow-b", label="dropped")
        jobs.get_agent(Recorder, "slow-b").cancel_submission(history.ids["dropped"])
        place(jobs, history, extra)
        try:
            yield history
        finally:
            for agent_type, name, submission_id in stalled.values():
                jobs.get_agent(agent_type, name).cancel_submission(submission_id)
            wait_all(jobs, stalled, "aborted")
            queued = {"waiting": ("Recorder", "stuck-a"), "behind": ("Night", "night-1")}
            wait_all(jobs, {k: (*a, history.ids[k]) for k, a in queued.items()}, "completed")


def place(jobs: ThinkJobs, history: History, extra: int) -> None:
    now, ids = history.now, history.ids
    for i, seconds in enumerate((1, 2, 3, 4, 10)):  # all finish 2 min ago
        started = now - 2 * M - seconds * S
        move(jobs, ids[f"quick-{i}"], started - 30 * S, started, now - 2 * M)
    move(jobs, ids["a"], now - 50 * M, now - 40 * M, now - 39 * M)  # ran 60 s
    move(jobs, ids["b"], now - 45 * M, now - 20 * M, now - 10 * M)  # ran 600 s
    move(jobs, ids["c"], now - 3 * 60 * M, now - 3 * 60 * M, now - 3 * 60 * M + 30 * S)
    move(jobs, ids["old"], now - 30 * 60 * M, now - 30 * 60 * M, now - 28 * 60 * M)
    move(jobs, ids["stuck-a"], now - 8 * M, now - 6 * M)  # running 360 s
    move(jobs, ids["slow-b"], now - 4 * M, now - 4 * M)  # running 240 s
    move(jobs, ids["night"], now - 2 * M, now - 90 * S)  # running 90 s
    move(jobs, ids["waiting"], now - 30 * M)
    move(jobs, ids["behind"], now - 70 * M)
    move(jobs, ids["dropped"], now - 8 * M, None, now - 5 * M)
    for k in range(extra):  # a busy hour for the picture
        end = now - 58 * M + k * (56 * M / max(extra, 1))
        started = end - (2 + k * 7 % 11) * S
        move(jobs, ids[f"extra-{k}"], started - (k % 5) * M - 20 * S, started, end)


def expected_depth() -> dict[str, list[int]]:
    """Pending turns at now-60 min + i min, i = 0..60, for the turns ``place`` sets up."""
    spans = {
        "Recorder": [(10, 19), (15, 39), (30, 60), (52, 53), (52, 54)],  # a b waiting stuck dropped
        "Night": [(0, 60), (58, 58)],  # behind, night
        "Support": [],
    }
    depth = {}
    for agent_type, ranges in spans.items():
        counts = [0] * 61
        for first, last in ranges:
            for i in range(first, last + 1):
                counts[i] += 1
        depth[agent_type] = counts
    return depth


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_queries_on_an_hour_of_real_turns(app: Flask, web_jobs: ThinkJobs) -> None:
    web_jobs.register(Night)
    with an_hour_of_history(app, web_jobs) as history, web_jobs.db.read() as conn:
        now, ids = history.now, history.ids
        depth = queries.queue_depth(conn, now=now)
        latency = queries.turn_latency(conn, now=now)
        oldest = queries.oldest_pending(conn)
        stuck = queries.stuck_turns(conn, now=now, rule=StuckRule())
        strict = queries.stuck_turns(conn, now=now, rule=StuckRule(3, min_s=200))
    assert depth.instants[0] == now - 60 * M and depth.instants[-1] == now
    assert {k: list(v) for k, v in depth.by_type.items()} == expected_depth()
    assert list(depth.total) == [sum(c) for c in zip(*expected_depth().values(), strict=True)]
    counted = {i: (b.count, b.p50_s, b.p95_s) for i, b in enumerate(latency) if b.count}
    assert counted == {4: (1, 60, 60), 10: (1, 600, 600), 11: (5, 3, pytest.approx(8.8))}
    assert [(o.agent_type, o.agent_name, o.submission_id, o.pending) for o in oldest] == [
        ("Night", "night-1", ids["behind"], 1),
        ("Recorder", "stuck-a", ids["waiting"], 1),
    ]
    assert oldest[0].age_s(now) == pytest.approx(70 * 60)
    assert [(t.request_id, t.usual_s, t.limit_s) for t in stuck] == [
        (ids["stuck-a"], pytest.approx(60, abs=1e-3), pytest.approx(300, abs=5e-3)),  # 30 60 600
        (ids["night"], None, 60.0),  # nothing completed: the floor alone
    ]
    assert stuck[0].running_s == pytest.approx(360)
    assert [t.request_id for t in strict] == [ids["stuck-a"], ids["slow-b"]]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_usual_duration_is_the_median_of_the_last_day(web_jobs: ThinkJobs) -> None:
    api = create_app(web_jobs, TEST_CONFIG).test_client()
    made = {f"d-{i}": ("Support", f"d-{i}", submit(api, "Support", f"d-{i}")) for i in range(4)}
    with worker(web_jobs, concurrency=4):
        wait_all(web_jobs, made, "completed")
    now = utcnow()
    for (_, _, submission_id), seconds, ago in zip(
        made.values(), (5, 7, 100, 9999), (M, 60 * M, 23 * 60 * M, 25 * 60 * M), strict=True
    ):
        move(web_jobs, submission_id, now - ago - seconds * S, now - ago - seconds * S, now - ago)
    with web_jobs.db.read() as conn:
        usual = queries.usual_durations(conn, now=now, agent_types=["Support", "Recorder"])
    assert usual == {"Support": pytest.approx(7.0, abs=1e-3)}  # 5, 7, 100 (25 h ago: out)


def test_the_stuck_rule() -> None:
    rule = StuckRule()
    assert (rule.limit_s(None), rule.limit_s(2.0), rule.limit_s(60.0)) == (60.0, 60.0, 300.0)
    assert StuckRule(factor=2, min_s=1).limit_s(3.0) == 6.0
    assert queries.quantile([1, 2, 3, 4, 10], 0.95) == pytest.approx(8.8)
    assert queries.quantile([7], 0.5) == 7


@pytest.mark.parametrize("backend", ["sqlite"])
def test_the_page_shows_charts_oldest_pending_and_stuck_turns(
    app: Flask, web_jobs: ThinkJobs
) -> None:
    web_jobs.register(Night)
    reader = app.test_client()
    log_in(reader, READ_TOKEN)
    with an_hour_of_history(app, web_jobs) as history:
        response = reader.get("/admin/dashboard")
    page = response.get_data(as_text=True)
    assert response.status_code == 200 and "Content-Security-Policy" in response.headers
    assert page.count('class="tj-chart"') == 3 and "<script" not in page
    assert "style=" not in page  # the CSP allows no inline style
    for title in ("Queue depth, last hour", "Turn run time, last hour", "Turns finished"):
        assert f'-title">{title}' in page
    waiting = f'href="/admin/agents/Recorder/stuck-a/requests/{history.ids["waiting"]}"'
    assert waiting in page and re.search(r'data-age-s="420\d"', page)  # Night's: 70 min
    stuck = page.split('id="tj-stuck"')[1]
    assert history.ids["stuck-a"] in stuck and history.ids["night"] in stuck
    assert history.ids["slow-b"] not in stuck
    assert re.search(r"<td>Support</td>\s*<td colspan=\"5\"[^>]*>nothing pending", page)


@pytest.mark.parametrize("backend", ["sqlite"])
def test_an_empty_dashboard_and_the_nav_link(app: Flask, web_jobs: ThinkJobs) -> None:
    reader = app.test_client()
    log_in(reader, READ_TOKEN)
    assert 'href="/admin/dashboard">Dashboard</a>' in reader.get("/admin/").get_data(as_text=True)
    page = reader.get("/admin/dashboard").get_data(as_text=True)
    assert "No running turn looks stuck." in page and "no turn finished in the last hour" in page
    assert page.count("nothing pending") == len(web_jobs.agent_types)
    custom = create_app(web_jobs, {**TEST_CONFIG, "THINK_JOBS_DASHBOARD_STUCK_FACTOR": 3})
    other = custom.test_client()
    log_in(other, READ_TOKEN)
    assert "longer than 3.0\u00d7 the median" in other.get("/admin/dashboard").get_data(
        as_text=True
    )


def test_charts_are_well_formed_svg_with_titles_and_gaps() -> None:
    axis = Axis(["10:00", "10:05", "10:10", "10:15"], [0, 3])
    chart = Chart("c1", "Run <time>", "p50 & p95", unit="s")
    svg = str(line_chart(chart, axis, [Series("p50", [1.0, None, 2.0, 2.5])], markers=True))
    root = ElementTree.fromstring(svg)  # well-formed XML; names are escaped
    ns = "{http://www.w3.org/2000/svg}"
    assert root.get("role") == "img" and root.get("aria-labelledby") == "c1-title c1-desc"
    assert "Run &lt;time&gt;" in svg and "p50 &amp; p95" in svg
    assert len(root.findall(f"{ns}polyline")) == 1  # 1.0 stands alone: a dot, no line
    dots = root.findall(f"{ns}circle")
    assert [d.findtext(f"{ns}title") for d in dots] == [
        "10:00 p50: 1 s",
        "10:10 p50: 2 s",
        "10:15 p50: 2.5 s",
    ]
    bars = ElementTree.fromstring(str(bar_chart(Chart("c2", "t", "d", integer=True), axis, [0, 3])))
    assert len(bars.findall(f"{ns}rect")) == 2
    assert scale(7, integer=True) == (8, [0, 2, 4, 6, 8]) and scale(0) == (
        1,
        [0, 0.25, 0.5, 0.75, 1],
    )
    assert (nice(0.3), nice(1.2, integer=True), nice(23)) == (0.5, 2, 25)


# -- in a real browser -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["postgres"])
def test_the_dashboard_in_a_browser(
    app: Flask, web_jobs: ThinkJobs, base_url: str, browser: Browser
) -> None:
    web_jobs.register(Night)
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    refused: list[str] = []
    page.on("console", lambda message: refused.append(message.text))
    page.goto(f"{base_url}/admin/login")
    page.fill("#tj-token", READ_TOKEN)
    page.click("button[type=submit]")
    with an_hour_of_history(app, web_jobs, extra=36) as history:
        page.get_by_role("link", name="Dashboard").click()
        expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()
        for name in ("Queue depth, last hour", "Turn run time, last hour"):
            expect(page.get_by_role("img", name=name)).to_be_visible()
        chart = page.get_by_role("img", name="Queue depth, last hour").bounding_box()
        assert chart is not None and chart["width"] > 800
        expect(page.locator("#tj-stuck")).to_contain_text(history.ids["stuck-a"])
        screenshot(page, "admin-dashboard.png", full_page=True)
        page.get_by_role("link", name=history.ids["waiting"]).click()
        expect(page.get_by_role("heading", name=history.ids["waiting"])).to_be_visible()
    assert not [text for text in refused if "Content Security Policy" in text], refused
