"""Issue 15 over HTTP: no input breaks an agent. Deep data and metadata are 400s that store
nothing; bodies over the limit are 413 on every transfer encoding; ids that a URL cannot carry
are 400s; stream positions are digits; a forwarded prefix is a path; and a stored message that
no longer reads back is a clear 409, not a 500."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from tests.apps.agents import Recorder
from tests.support.builders import user
from tests.web.conftest import TEST_CONFIG
from tests.web.support import FULL, WEBHOOK_SECRET, agent_url
from think_jobs import ThinkJobs
from think_jobs.context import utcnow
from think_jobs.db import conversation as conversation_ops
from think_jobs.db.tables import turns
from web import create_app
from web.webhooks import signature

pytestmark = pytest.mark.parametrize("backend", ["sqlite"])
SUBMISSIONS = agent_url(rest="/submissions")


def nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def deep_message(levels: int, message_id: str = "m-deep") -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "data-x", "data": nested(levels)}]}


def error_of(response: TestResponse) -> dict[str, Any]:
    body = response.json
    assert isinstance(body, dict) and set(body) == {"error"}, body
    found: dict[str, Any] = body["error"]
    return found


def nothing_stored(client: FlaskClient) -> bool:
    listed = client.get(SUBMISSIONS, headers=FULL)
    return listed.status_code == 200 and listed.json == {"submissions": [], "next_before": None}


# -- 1, 2: deep data and metadata --------------------------------------------------------------


def test_case_1_deep_data_is_a_400_naming_the_field_and_nothing_is_stored(
    client: FlaskClient,
) -> None:
    """The 618-byte message that disabled an agent for good (and at >= 255 levels a 500)."""
    for levels in (250, 255, 900):
        response = client.post(SUBMISSIONS, headers=FULL, json={"messages": [deep_message(levels)]})
        assert response.status_code == 400, levels
        error = error_of(response)
        assert error["type"] == "message_validation"
        assert error["message"].startswith(
            f"messages[0].parts[0].data: nested {levels} levels deep; the limit is 64"
        )
    assert nothing_stored(client)
    assert client.get(agent_url(rest="/messages"), headers=FULL).status_code == 200


def test_case_2_deep_metadata_is_a_400_and_the_listing_keeps_working(client: FlaskClient) -> None:
    """Metadata 256 levels deep was stored, then every listing of the agent was a 500."""
    body = {"messages": [user("hi")], "metadata": {"a": nested(255)}}
    assert len(json.dumps(body)) < 1000
    response = client.post(SUBMISSIONS, headers=FULL, json=body)
    assert response.status_code == 400
    assert error_of(response)["message"].startswith(
        "metadata: nested 256 levels deep; the limit is 64 (THINK_JOBS_MAX_JSON_DEPTH)"
    )
    assert nothing_stored(client)


def test_an_unreadable_stored_message_is_a_409_naming_it_not_a_500(
    client: FlaskClient, web_jobs: ThinkJobs
) -> None:
    """A row written before the limits existed (or by hand) must not brick the API."""
    agent = web_jobs.get_agent(Recorder, "a")
    agent_id = web_jobs.agent_id_of(agent, create=True)
    assert agent_id is not None
    with web_jobs.db.write() as conn:
        conversation_ops.append_messages(
            conn, agent_id, [user("fine"), deep_message(250, "old-1")], turn_id=None, now=utcnow()
        )
    response = client.get(agent_url(rest="/messages"), headers=FULL)
    assert response.status_code == 409
    error = error_of(response)
    assert error["type"] == "unreadable_message"
    assert error["details"]["message_id"] == "old-1"
    assert error["details"]["position"] == 1
    assert "think-jobs messages remove|repair Recorder a old-1" in error["message"]


def test_submission_metadata_stored_too_deep_before_the_limits_reads_back_as_a_note(
    client: FlaskClient, web_jobs: ThinkJobs
) -> None:
    """Issue 15, case 2, for a row an older version stored: the listing and the detail answer
    200 (with a note in place of the metadata), not a 500, and the row can be deleted."""
    body = {"messages": [user("hi")], "submission_id": "s-old", "metadata": {"ok": True}}
    assert client.post(SUBMISSIONS, headers=FULL, json=body).status_code == 202
    with web_jobs.db.write() as conn:  # as a version without the limits left it
        conn.execute(turns.update().values({turns.c.metadata: {"deep": nested(256)}}))
    listed = client.get(SUBMISSIONS, headers=FULL)
    assert listed.status_code == 200, listed.get_data(as_text=True)
    [row] = listed.json["submissions"]  # type: ignore[index]
    assert row["metadata"] == {
        "unreadable_metadata": "nested 257 levels deep, more than 128 can be read back; "
        "stored before the input limits: delete the submission"
    }
    detail = client.get(agent_url(rest="/submissions/s-old"), headers=FULL)
    assert detail.status_code == 200
    assert detail.json["metadata"] == row["metadata"]  # type: ignore[index]
    one = agent_url(rest="/submissions/s-old")
    assert client.post(one + "/cancel", headers=FULL).status_code == 200  # pending: cancelled
    assert client.delete(one, headers=FULL).status_code == 204


# -- 4: stream positions -----------------------------------------------------------------------


def test_case_4_last_event_id_and_after_seq_take_ascii_digits_of_bounded_length(
    client: FlaskClient,
) -> None:
    client.post(SUBMISSIONS, headers=FULL, json={"messages": [user("hi")], "submission_id": "s-1"})
    url = agent_url(rest="/requests/s-1/stream")
    for bad in ("\u00b2", "1" * 5000, "-1", " 1", "1e3", "0x10", "1" * 19):
        response = client.get(url, headers={**FULL, "Last-Event-ID": bad})
        assert response.status_code == 400, bad
        assert "Last-Event-ID" in error_of(response)["message"]
    for bad in ("1" * 5000, "\u00b2", "1" * 19):
        response = client.get(f"{url}?after_seq={bad}", headers=FULL)
        assert response.status_code == 400, bad
        assert error_of(response)["type"] == "validation_error"


# -- 5: bodies over the limit, on every transfer encoding --------------------------------------


def post_chunked(base_url: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    """POST ``body`` with ``Transfer-Encoding: chunked`` (no Content-Length) over real HTTP."""
    parts = urlsplit(base_url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)
    pieces: Iterator[bytes] = (body[i : i + 65536] for i in range(0, len(body), 65536))
    try:
        sent = {"Content-Type": "application/json", **headers}
        connection.request("POST", path, body=pieces, headers=sent, encode_chunked=True)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def padded(document: object, size: int) -> bytes:
    """Valid JSON followed by spaces, ``size`` bytes in all (still valid JSON)."""
    head = json.dumps(document).encode()
    return head + b" " * (size - len(head))


def test_case_5_a_chunked_body_over_the_limit_is_413_not_truncated(
    base_url: str, web_jobs: ThinkJobs
) -> None:
    limit = web_jobs.settings.max_request_bytes
    document = {"messages": [user("hi")]}
    status, body = post_chunked(base_url, SUBMISSIONS, padded(document, 2 * limit), FULL)
    assert status == 413, body
    assert body["error"]["type"] == "payload_too_large"
    status, _body = post_chunked(base_url, SUBMISSIONS, padded(document, limit + 1), FULL)
    assert status == 413
    status, _body = post_chunked(base_url, SUBMISSIONS, padded(document, limit), FULL)
    assert status == 202  # exactly the limit fits
    assert len(web_jobs.get_agent(Recorder, "a").list_submissions()) == 1


def test_case_5_a_chunked_webhook_is_checked_over_its_whole_body(
    base_url: str, web_jobs: ThinkJobs
) -> None:
    limit = web_jobs.settings.max_request_bytes
    body = padded({"n": 1}, 2 * limit)
    for signed in (body[:limit], body):
        headers = {"X-Signature-256": signature(WEBHOOK_SECRET, signed), "X-Delivery-Id": "d-1"}
        status, _found = post_chunked(base_url, "/hooks/Recorder/inbox", body, headers)
        assert status == 413
    small = padded({"n": 1}, 5000)
    headers = {"X-Signature-256": signature(WEBHOOK_SECRET, small), "X-Delivery-Id": "d-2"}
    assert post_chunked(base_url, "/hooks/Recorder/inbox", small, headers)[0] == 202
    headers["X-Signature-256"] = signature(WEBHOOK_SECRET, small[:4000])
    headers["X-Delivery-Id"] = "d-3"
    assert post_chunked(base_url, "/hooks/Recorder/inbox", small, headers)[0] == 401
    assert len(web_jobs.get_agent(Recorder, "inbox").list_submissions()) == 1


# -- 6, 7: ids a URL can carry; headers and bodies as documented -------------------------------


@pytest.mark.parametrize("submission_id", ["a/b", "..", ".", " a", "caf\u00e9"])
def test_case_6_a_submission_id_the_routes_cannot_reach_is_a_400(
    client: FlaskClient, submission_id: str
) -> None:
    body = {"messages": [user("hi")], "submission_id": submission_id}
    response = client.post(SUBMISSIONS, headers=FULL, json=body)
    assert response.status_code == 400
    assert nothing_stored(client)


def test_case_6_agents_named_dot_or_dot_dot_cannot_be_created(
    client: FlaskClient, web_jobs: ThinkJobs
) -> None:
    for name in ("%2E", "%2E%2E"):
        url = f"/api/agents/Recorder/{name}/submissions"
        response = client.post(url, headers=FULL, json={"messages": [user("hi")]})
        assert response.status_code == 400, name
    assert client.get("/api/agents", headers=FULL).json["agents"] == []  # type: ignore[index]
    opened = client.get("/admin/open?agent_type=Recorder&agent_name=..", headers=FULL)
    assert opened.status_code == 400


def test_an_accepted_submission_id_is_reachable_at_its_location(client: FlaskClient) -> None:
    submission_id = "~!$&'()*+,;=:@?#[]%."
    body = {"messages": [user("hi")], "submission_id": submission_id}
    created = client.post(SUBMISSIONS, headers=FULL, json=body)
    assert created.status_code == 202
    found = client.get(created.headers["Location"], headers=FULL)
    assert found.status_code == 200
    assert found.json["submission_id"] == submission_id  # type: ignore[index]


def test_case_7_a_non_ascii_idempotency_key_and_a_blank_cancel_body_are_400s(
    client: FlaskClient,
) -> None:
    body = {"messages": [user("hi")]}
    header = {**FULL, "Idempotency-Key": "\u00d7\u00f8"}
    response = client.post(SUBMISSIONS, headers=header, json=body)
    assert response.status_code == 400
    assert "Idempotency-Key" in error_of(response)["message"]
    assert nothing_stored(client)
    client.post(SUBMISSIONS, headers=FULL, json={**body, "submission_id": "s-1"})
    for url in (agent_url(rest="/submissions/s-1/cancel"), agent_url(rest="/requests/s-1/cancel")):
        blank = client.post(url, headers=FULL, data=" ", content_type="application/json")
        assert blank.status_code == 400, url
        assert error_of(blank)["type"] == "invalid_json"
    pending = client.get(agent_url(rest="/submissions/s-1"), headers=FULL).json
    assert pending is not None and pending["status"] == "pending"
    assert client.post(agent_url(rest="/submissions/s-1/cancel"), headers=FULL).status_code == 200


# -- 10: the forwarded prefix ------------------------------------------------------------------


def test_case_10_a_forwarded_prefix_must_be_a_path(web_jobs: ThinkJobs) -> None:
    client = create_app(web_jobs, {**TEST_CONFIG, "THINK_JOBS_PROXY_FIX": 1}).test_client()
    for prefix in ("//evil.example", "https://evil.example", "/\\evil.example", "evil"):
        for path in ("/admin/", "/"):
            response = client.get(path, headers={"X-Forwarded-Prefix": prefix})
            assert response.status_code == 400, (prefix, path)
            assert "Location" not in response.headers
            assert error_of(response)["type"] == "invalid_forwarded_prefix"
    fine = client.get("/admin/", headers={"X-Forwarded-Prefix": "/ops"})
    assert fine.status_code == 302
    assert fine.headers["Location"].startswith("/ops/admin/login")


def test_an_embedded_host_that_trusts_a_bad_prefix_gets_no_offsite_redirect(
    web_jobs: ThinkJobs,
) -> None:
    client = create_app(web_jobs, TEST_CONFIG).test_client()
    response = client.get(
        "/admin/", environ_overrides={"SCRIPT_NAME": "//evil.example"}, headers=FULL
    )
    assert response.status_code == 400
    assert "Location" not in response.headers
