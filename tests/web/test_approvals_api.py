"""Tool approvals over HTTP (SPEC §13): ``GET/POST /api/agents/{type}/{name}/approvals[/{id}]``
with the API's auth (bearer token, or the admin session with its CSRF header; write scope to
answer), and the chat transport's approval flow as the AI SDK's ``addToolApprovalResponse``
sends it. Real worker, real Redis, SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.support.builders import user, wait_for_status, wait_until
from tests.web.support import FULL, FULL_TOKEN, READ, READ_TOKEN, csrf_from, log_in, read_all
from think_jobs import Approval, Think, ThinkJobs, tool
from think_jobs.models import Reply, ScriptedModel, ToolCall
from think_jobs.testing import worker
from think_jobs.tools import Tool

RAN: list[int] = []
URL = "/api/agents/WebPayer/{name}/approvals"
CHAT = "/api/agents/WebPayer/chat"


class WebPayer(Think):
    def get_model(self) -> ScriptedModel:
        first = Reply(tool_calls=[ToolCall("pay", {"amount": 7}, id="call-1")], then=Reply("paid"))
        return ScriptedModel([first, "next"])

    def get_tools(self) -> dict[str, Tool]:
        @tool(needs_approval=True)
        def pay(amount: int) -> str:
            """Pay."""
            RAN.append(amount)
            return f"paid {amount}"

        return {"pay": pay}


@pytest.fixture(autouse=True)
def _registered(web_jobs: ThinkJobs) -> None:
    RAN.clear()
    web_jobs.register(WebPayer)


def pending(agent: Think) -> Approval:
    (found,) = wait_until(lambda: agent.list_approvals(status="pending"))
    assert isinstance(found, Approval)
    return found


def error_type(response: Any) -> str:
    return str(response.get_json()["error"]["type"])


def test_list_inspect_and_answer_over_http(web_jobs: ThinkJobs, client: FlaskClient) -> None:
    agent = web_jobs.get_agent(WebPayer, "a")
    agent.submit_messages([user("pay")])
    base = URL.format(name="a")
    with worker(web_jobs):
        approval = pending(agent)
        one = f"{base}/{approval.approval_id}"
        listed = client.get(f"{base}?status=pending", headers=READ)
        assert listed.status_code == 200
        (row,) = listed.get_json()["approvals"]
        assert (row["approval_id"], row["tool_name"], row["input"]) == (
            approval.approval_id,
            "pay",
            {"amount": 7},
        )
        assert client.get(one, headers=READ).get_json()["status"] == "pending"
        assert client.get(f"{base}/nope", headers=READ).status_code == 404
        assert error_type(client.get(f"{base}/nope", headers=READ)) == "unknown_approval"
        assert client.get(f"{base}?status=open", headers=READ).status_code == 400
        assert client.post(one, headers=READ, json={"approved": True}).status_code == 403
        assert client.post(one, json={"approved": True}).status_code == 401
        assert client.post(one, headers=FULL, json={"approved": "yes"}).status_code == 400
        answered = client.post(one, headers=FULL, json={"approved": True, "reason": "ok"})
        assert answered.status_code == 200 and answered.get_json()["status"] == "approved"
        again = client.post(one, headers=FULL, json={"approved": True})
        assert again.status_code == 200 and again.get_json()["reason"] == "ok"
        other = client.post(one, headers=FULL, json={"approved": False})
        assert other.status_code == 409 and error_type(other) == "approval_closed"
        missing = client.post(f"{base}/nope", headers=FULL, json={"approved": True})
        assert missing.status_code == 404
        wait_for_status(agent, approval.continuation_id, "completed")
    assert RAN == [7]


@pytest.mark.parametrize("backend", ["sqlite"])
def test_the_admin_session_answers_with_its_csrf_header(app: Flask, web_jobs: ThinkJobs) -> None:
    client = app.test_client()
    agent = web_jobs.get_agent(WebPayer, "b")
    agent.submit_messages([user("pay")])
    with worker(web_jobs):
        approval = pending(agent)
        one = f"{URL.format(name='b')}/{approval.approval_id}"
        log_in(client, FULL_TOKEN)
        refused = client.post(one, json={"approved": False})
        assert refused.status_code == 403 and error_type(refused) == "csrf_failed"
        token = csrf_from(client.get("/admin/").get_data(as_text=True))
        denied = client.post(one, headers={"X-CSRF-Token": token}, json={"approved": False})
        assert denied.status_code == 200 and denied.get_json()["status"] == "denied"
        wait_for_status(agent, approval.continuation_id, "completed")
    assert RAN == []


def _chunks(response: Any) -> list[dict[str, Any]]:
    return [e.chunk for e in read_all(response) if e.chunk is not None]


def test_the_chat_transport_carries_the_sdk_approval_flow(
    web_jobs: ThinkJobs, client: FlaskClient
) -> None:
    """``addToolApprovalResponse`` marks the part ``approval-responded`` and the SDK POSTs
    the chat again (``sendAutomaticallyWhen``): the answer is taken from the assistant message
    and the continuation streams, extending that message."""
    asked = user("pay", "u-1")
    with worker(web_jobs):
        first = client.post(
            CHAT, headers=FULL, json={"id": "c", "messages": [asked], "trigger": "submit-message"}
        )
        chunks = _chunks(first)
        request = next(c for c in chunks if c["type"] == "tool-approval-request")
        start = next(c for c in chunks if c["type"] == "start")
        assert client.get(f"{CHAT}/c/stream", headers=FULL).status_code == 204  # waits
        reply = web_jobs.get_agent(WebPayer, "c").get_messages()[-1].to_wire()
        part = next(p for p in reply["parts"] if p["type"] == "tool-pay")
        assert part["state"] == "approval-requested"
        part["state"] = "approval-responded"  # what addToolApprovalResponse does
        part["approval"] = {"id": request["approvalId"], "approved": True}
        payload = {
            "id": "c",
            "messages": [asked, reply],
            "trigger": "submit-message",
            "messageId": reply["id"],
        }
        second = client.post(CHAT, headers=FULL, json=payload)
        assert second.status_code == 200
        more = _chunks(second)
    assert start["messageId"] == reply["id"]
    assert next(c for c in more if c["type"] == "start")["messageId"] == reply["id"]
    outputs = [c for c in more if c["type"] == "tool-output-available"]
    assert [(c["toolCallId"], c["output"]) for c in outputs] == [("call-1", "paid 7")]
    assert "".join(c["delta"] for c in more if c["type"] == "text-delta") == "paid"
    assert RAN == [7]
    retried = client.post(CHAT, headers=FULL, json=payload)  # a retried POST runs nothing new
    assert retried.status_code == 200 and RAN == [7]
    retried.close()


@pytest.mark.parametrize("backend", ["sqlite"])
def test_the_admin_detail_page_approves_and_denies(app: Flask, web_jobs: ThinkJobs) -> None:
    client = app.test_client()
    agent = web_jobs.get_agent(WebPayer, "d")
    first = agent.submit_messages([user("pay")])
    page_url = f"/admin/agents/WebPayer/d/requests/{first.submission_id}"
    with worker(web_jobs):
        approval = pending(agent)
        log_in(client, READ_TOKEN)  # read scope: the page shows the approval, no buttons
        shown = client.get(page_url).get_data(as_text=True)
        assert f'data-approval="{approval.approval_id}"' in shown and ">Approve<" not in shown
        client.post("/admin/logout", data={"csrf_token": csrf_from(shown)})
        log_in(client, FULL_TOKEN)
        page = client.get(page_url).get_data(as_text=True)
        assert ">Approve<" in page and ">Deny<" in page and approval.continuation_id in page
        action = f"/admin/agents/WebPayer/d/approvals/{approval.approval_id}/approve"
        assert client.post(action, data={}).status_code == 403  # no CSRF token
        done = client.post(action, data={"csrf_token": csrf_from(page)})
        assert done.status_code == 302 and done.headers["Location"].endswith(page_url)
        wait_for_status(agent, approval.continuation_id, "completed")
        after = client.get(page_url).get_data(as_text=True)
    assert "approved from the admin page" in after and ">Approve<" not in after
    assert RAN == [7]
