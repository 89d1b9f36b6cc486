"""The JSON API against real services: every endpoint, its success codes and its error codes."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from flask.testing import FlaskClient

from tests.apps.agents import Recorder
from tests.support.builders import directive, user, wait_for_status
from tests.support.processes import free_port
from tests.web.conftest import TEST_CONFIG
from tests.web.support import FULL, FULL_TOKEN, SECRET_KEY, agent_url
from think_jobs import ThinkJobs
from think_jobs.testing import worker
from web import create_app

SUBMISSIONS = agent_url(rest="/submissions")


def submit(client: FlaskClient, *messages: dict[str, object], **body: object) -> dict[str, object]:
    response = client.post(
        SUBMISSIONS, headers=FULL, json={"messages": list(messages) or [user("hi")], **body}
    )
    assert response.status_code == 202, response.json
    assert response.json is not None
    accepted: dict[str, object] = response.json
    return accepted


def error_of(response: object) -> dict[str, object]:
    body = getattr(response, "json", None)
    assert isinstance(body, dict) and set(body) == {"error"}, body
    assert set(body["error"]) == {"type", "message", "details"}
    error: dict[str, object] = body["error"]
    return error


# -- agents -------------------------------------------------------------------------------------


def test_agents_lists_registered_types_and_agents_with_counts(client: FlaskClient) -> None:
    assert client.get("/api/agents", headers=FULL).json == {
        "agent_types": ["Recorder", "Support"],
        "agents": [],
    }
    submit(client)
    submit(client)
    agents = client.get("/api/agents", headers=FULL).json
    assert agents is not None
    assert agents["agents"] == [
        {"agent_type": "Recorder", "agent_name": "a", "pending": 2, "running": 0}
    ]


def test_messages_of_an_agent_after_a_real_turn(client: FlaskClient, web_jobs: ThinkJobs) -> None:
    created = submit(client, directive(message_id="m-1", label="x", text="hello there"))
    with worker(web_jobs):
        wait_for_status(
            web_jobs.get_agent(Recorder, "a"), str(created["submission_id"]), "completed"
        )
    response = client.get(agent_url(rest="/messages"), headers=FULL)
    assert response.status_code == 200
    messages = response.json["messages"]  # type: ignore[index]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert messages[0]["id"] == "m-1"
    assert messages[1]["parts"][-1] == {"type": "text", "text": "hello there", "state": "done"}


def test_unknown_agent_type_is_404_everywhere(client: FlaskClient) -> None:
    for method, path in [
        ("get", "/messages"),
        ("get", "/submissions"),
        ("post", "/submissions"),
        ("delete", "/submissions"),
        ("get", "/submissions/s1"),
        ("delete", "/submissions/s1"),
        ("post", "/submissions/s1/cancel"),
        ("get", "/requests/r1/stream"),
        ("post", "/requests/r1/cancel"),
    ]:
        response = getattr(client, method)(agent_url("Nope", "a", path), headers=FULL, json={})
        assert response.status_code == 404, (method, path)
        assert error_of(response)["type"] == "agent_not_registered"


# -- submit -------------------------------------------------------------------------------------


def test_submit_answers_202_then_200_for_the_same_idempotency_key(client: FlaskClient) -> None:
    headers = {**FULL, "Idempotency-Key": "order-1"}
    first = client.post(SUBMISSIONS, headers=headers, json={"messages": [user("a")]})
    again = client.post(SUBMISSIONS, headers=headers, json={"messages": [user("other")]})
    assert (first.status_code, again.status_code) == (202, 200)
    assert first.json["accepted"] is True and again.json["accepted"] is False  # type: ignore[index]
    assert again.json["submission_id"] == first.json["submission_id"]  # type: ignore[index]
    assert first.json["status"] == "pending"  # type: ignore[index]
    assert first.headers["Location"] == agent_url(
        rest=f"/submissions/{first.json['submission_id']}"  # type: ignore[index]
    )
    by_field = client.post(
        SUBMISSIONS, headers=FULL, json={"messages": [user("a")], "idempotency_key": "order-1"}
    )
    assert by_field.status_code == 200


def test_submit_takes_submission_id_and_metadata(client: FlaskClient) -> None:
    created = submit(client, submission_id="sub-1", metadata={"ticket": 7})
    assert created["submission_id"] == "sub-1" and created["metadata"] == {"ticket": 7}


def test_submit_header_and_field_must_agree(client: FlaskClient) -> None:
    response = client.post(
        SUBMISSIONS,
        headers={**FULL, "Idempotency-Key": "k1"},
        json={"messages": [user("a")], "idempotency_key": "k2"},
    )
    assert response.status_code == 400
    assert "differ" in str(error_of(response)["message"])


def test_submit_rejects_a_bad_idempotency_key_header_and_stores_nothing(
    client: FlaskClient,
) -> None:
    for bad in ("k" * 600, ""):
        response = client.post(
            SUBMISSIONS, headers={**FULL, "Idempotency-Key": bad}, json={"messages": [user("a")]}
        )
        assert response.status_code == 400, bad
    assert client.get(SUBMISSIONS, headers=FULL).json == {"submissions": [], "next_before": None}


def test_submit_conflict_is_409(client: FlaskClient) -> None:
    submit(client, submission_id="s-1", idempotency_key="k-1")
    response = client.post(
        SUBMISSIONS,
        headers=FULL,
        json={"messages": [user("a")], "submission_id": "s-2", "idempotency_key": "k-1"},
    )
    assert response.status_code == 409
    error = error_of(response)
    assert error["type"] == "submission_conflict"
    assert error["message"] == "submission_id and idempotency_key refer to different submissions"


def test_submit_validation_errors_are_400_and_store_nothing(client: FlaskClient) -> None:
    cases = {
        "empty_submission": {"messages": []},
        "message_validation": {"messages": [{"id": "m", "role": "user", "parts": [{"x": 1}]}]},
        "validation_error": {"messages": [user("a")], "surprise": True},
    }
    for expected, body in cases.items():
        response = client.post(SUBMISSIONS, headers=FULL, json=body)
        assert response.status_code == 400, body
        assert error_of(response)["type"] == expected
    empty = client.post(SUBMISSIONS, headers=FULL, json={"messages": []})
    assert error_of(empty)["message"] == "submit_messages requires at least one message"
    bad_part = client.post(SUBMISSIONS, headers=FULL, json=cases["message_validation"])
    assert "messages[0].parts[0].type" in str(error_of(bad_part)["message"])
    listed = client.get(SUBMISSIONS, headers=FULL).json
    assert listed == {"submissions": [], "next_before": None}


def test_submit_rejects_bad_json_wrong_type_and_bad_ids(client: FlaskClient) -> None:
    not_json = client.post(SUBMISSIONS, headers=FULL, data="{", content_type="application/json")
    assert not_json.status_code == 400 and error_of(not_json)["type"] == "invalid_json"
    form = client.post(SUBMISSIONS, headers=FULL, data={"messages": "x"})
    assert form.status_code == 415 and error_of(form)["type"] == "unsupported_media_type"
    nul = client.post(
        SUBMISSIONS, headers=FULL, json={"messages": [user("a")], "submission_id": "a\x00"}
    )
    assert nul.status_code == 400
    long_name = client.get(agent_url(name="n" * 201, rest="/submissions"), headers=FULL)
    assert long_name.status_code == 400


def test_too_large_body_is_413_and_too_many_messages_is_400(
    client: FlaskClient, web_jobs: ThinkJobs
) -> None:
    big = {"messages": [user("x" * (web_jobs.settings.max_request_bytes + 1))]}
    response = client.post(SUBMISSIONS, headers=FULL, json=big)
    assert response.status_code == 413
    assert error_of(response)["type"] == "payload_too_large"
    many = [user(str(i)) for i in range(web_jobs.settings.max_messages_per_submission + 1)]
    response = client.post(SUBMISSIONS, headers=FULL, json={"messages": many})
    assert response.status_code == 400
    assert "at most 100 messages" in str(error_of(response)["message"])


# -- list, inspect, cancel, delete --------------------------------------------------------------


def test_list_filters_by_status_and_limits(client: FlaskClient) -> None:
    ids = [submit(client, submission_id=f"s-{i}")["submission_id"] for i in range(3)]
    client.post(agent_url(rest="/submissions/s-0/cancel"), headers=FULL)

    def listed(query: str) -> list[str]:
        body = client.get(f"{SUBMISSIONS}?{query}", headers=FULL).json
        return [s["submission_id"] for s in body["submissions"]]  # type: ignore[index]

    assert listed("") == ids[::-1]
    assert listed("status=aborted") == ["s-0"]
    assert listed("status=pending&status=aborted") == ids[::-1]
    assert listed("status=pending,aborted&limit=2") == ids[::-1][:2]
    for bad in (
        "status=nope",
        "status=",
        "status=pending,",
        "limit=0",
        "limit=101",
        "limit=x",
        "limit=+5",
        "limit=%205",
        "limit=1_0",
    ):
        response = client.get(f"{SUBMISSIONS}?{bad}", headers=FULL)
        assert response.status_code == 400, bad
        assert error_of(response)["type"] == "validation_error"


def test_list_pages_with_next_before(client: FlaskClient) -> None:
    ids = [submit(client, submission_id=f"s-{i}")["submission_id"] for i in range(5)]
    pages: list[list[str]] = []
    query = "limit=2"
    while True:
        body = client.get(f"{SUBMISSIONS}?{query}", headers=FULL).json
        assert body is not None
        pages.append([s["submission_id"] for s in body["submissions"]])
        if body["next_before"] is None:
            break
        query = f"limit=2&before={body['next_before']}"
    assert pages == [ids[4:2:-1], ids[2:0:-1], ids[:1]]
    exact = client.get(f"{SUBMISSIONS}?limit=5", headers=FULL).json
    assert exact is not None and exact["next_before"] is None  # a full last page says so
    response = client.get(f"{SUBMISSIONS}?before=elsewhere", headers=FULL)
    assert response.status_code == 404 and error_of(response)["type"] == "unknown_cursor"
    assert "is not a submission of agent" in str(error_of(response)["message"])


def test_inspect_and_404(client: FlaskClient) -> None:
    created = submit(client, submission_id="s-1")
    found = client.get(agent_url(rest="/submissions/s-1"), headers=FULL)
    assert found.status_code == 200
    later = {"accepted", "waiting_reason"}  # inspecting a pending one says why it waits
    assert {k: v for k, v in found.json.items() if k not in later} == {  # type: ignore[union-attr]
        k: v for k, v in created.items() if k not in later
    }
    assert found.json["waiting_reason"].startswith(  # type: ignore[index]
        "no live worker serves agent type Recorder"
    )
    missing = client.get(agent_url(rest="/submissions/nope"), headers=FULL)
    assert missing.status_code == 404 and error_of(missing)["type"] == "not_found"
    other_agent = client.get(agent_url(name="b", rest="/submissions/s-1"), headers=FULL)
    assert other_agent.status_code == 404


def test_cancel_a_pending_submission_with_a_reason(client: FlaskClient) -> None:
    submit(client, submission_id="s-1")
    url = agent_url(rest="/submissions/s-1/cancel")
    response = client.post(url, headers=FULL, json={"reason": "changed my mind"})
    assert response.status_code == 200
    assert response.json["status"] == "aborted"  # type: ignore[index]
    assert response.json["error"] == "changed my mind"  # type: ignore[index]
    again = client.post(url, headers=FULL)  # terminal: a no-op, same answer
    assert again.status_code == 200 and again.json["error"] == "changed my mind"  # type: ignore[index]
    missing = client.post(agent_url(rest="/submissions/nope/cancel"), headers=FULL)
    assert missing.status_code == 404


def test_delete_one_is_409_while_pending_then_204_then_404(client: FlaskClient) -> None:
    submit(client, submission_id="s-1")
    url = agent_url(rest="/submissions/s-1")
    pending = client.delete(url, headers=FULL)
    assert pending.status_code == 409 and error_of(pending)["type"] == "submission_active"
    client.post(f"{url}/cancel", headers=FULL)
    deleted = client.delete(url, headers=FULL)
    assert deleted.status_code == 204 and deleted.data == b""
    assert client.delete(url, headers=FULL).status_code == 404


@pytest.mark.parametrize(
    "when", ["9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59", "9999-12-31T23:00:00-01:00"]
)
def test_a_completed_before_out_of_range_in_utc_is_a_400_that_deletes_nothing(
    client: FlaskClient, when: str
) -> None:
    """A valid timestamp whose UTC instant is past year 9999 or before year 1 was a driver's
    error, answered 500 (fixed 2026-12-07)."""
    submit(client, submission_id="kept")
    client.post(agent_url(rest="/submissions/kept/cancel"), headers=FULL)
    response = client.delete(SUBMISSIONS, headers=FULL, query_string={"completed_before": when})
    assert response.status_code == 400
    assert "out of range in UTC" in response.json["error"]["message"]  # type: ignore[index]
    assert client.get(f"{SUBMISSIONS}/kept", headers=FULL).status_code == 200


def test_delete_many_takes_status_completed_before_and_limit(client: FlaskClient) -> None:
    for i in range(4):
        submit(client, submission_id=f"s-{i}")
    for i in range(3):
        client.post(agent_url(rest=f"/submissions/s-{i}/cancel"), headers=FULL)
    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()

    def delete(query: dict[str, str]) -> object:
        response = client.delete(SUBMISSIONS, headers=FULL, query_string=query)
        return response.json["deleted"] if response.status_code == 200 else response.status_code  # type: ignore[index]

    assert delete({"completed_before": past}) == 0
    assert delete({"status": "completed"}) == 0
    assert delete({"completed_before": future, "limit": "2"}) == 2
    assert delete({}) == 1
    for bad in ("2026-01-01T00:00:00", "0", "1700000000", "2026-01-01"):  # naive, Unix, date
        assert delete({"completed_before": bad}) == 400, bad
    listed = client.get(SUBMISSIONS, headers=FULL).json
    assert [s["status"] for s in listed["submissions"]] == ["pending"]  # type: ignore[index]


def test_cancel_a_request_by_id(client: FlaskClient, web_jobs: ThinkJobs) -> None:
    submit(client, submission_id="s-1")
    response = client.post(
        agent_url(rest="/requests/s-1/cancel"), headers=FULL, json={"reason": "stop"}
    )
    assert response.status_code == 202 and response.json == {"request_id": "s-1"}
    inspected = web_jobs.get_agent(Recorder, "a").inspect_submission("s-1")
    assert inspected is not None and inspected.status == "aborted" and inspected.error == "stop"
    unknown = client.post(agent_url(rest="/requests/nope/cancel"), headers=FULL)
    assert unknown.status_code == 202  # a no-op, like cancel_chat


def test_wrong_method_is_405_json(client: FlaskClient) -> None:
    response = client.put(SUBMISSIONS, headers=FULL)
    assert response.status_code == 405
    assert error_of(response)["type"] == "method_not_allowed"
    assert "POST" in response.headers["Allow"]
    assert client.get("/api/nothing", headers=FULL).status_code == 404


# -- services down ------------------------------------------------------------------------------


def _app_with(make_jobs: Callable[..., ThinkJobs], **overrides: str) -> FlaskClient:
    jobs = make_jobs(api_tokens=FULL_TOKEN, secret_key=SECRET_KEY, **overrides)
    jobs.register(Recorder)
    return create_app(jobs, TEST_CONFIG).test_client()


def test_storage_down_is_503(make_jobs: Callable[..., ThinkJobs]) -> None:
    dead = f"postgresql+psycopg://postgres:postgres@127.0.0.1:{free_port()}/none"
    client = _app_with(make_jobs, database_url=dead)
    for response in (
        client.get("/api/agents", headers=FULL),
        client.post(SUBMISSIONS, headers=FULL, json={"messages": [user("a")]}),
    ):
        assert response.status_code == 503
        assert error_of(response)["type"] == "storage_unavailable"


def test_redis_down_is_503_for_streams(make_jobs: Callable[..., ThinkJobs]) -> None:
    client = _app_with(make_jobs, redis_url=f"redis://127.0.0.1:{free_port()}/0")
    body = {"messages": [user("hi")]}
    accepted = client.post(agent_url(rest="/submissions"), json=body, headers=FULL)
    assert accepted.status_code == 202  # accepted without Redis: the row is the record
    request_id = accepted.json["submission_id"]  # type: ignore[index]
    response = client.get(agent_url(rest=f"/requests/{request_id}/stream"), headers=FULL)
    assert response.status_code == 503
    assert error_of(response)["type"] == "broker_unavailable"
