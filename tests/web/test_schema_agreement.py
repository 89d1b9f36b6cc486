"""The OpenAPI document and the server agree on every header, path and body pattern: a value
the document allows is never refused for that field, a value it does not allow is a 400.
(Issue 15, case 7: the document said ``^[!-~]+$`` for ``Idempotency-Key`` while the server
took ``\u00d7\u00f8``.)"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.builders import user
from tests.web.support import FULL, WEBHOOK_SECRET, agent_url
from web.webhooks import signature

pytestmark = pytest.mark.parametrize("backend", ["sqlite"])
FUZZ = settings(
    max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)
SUBMISSIONS = "/api/agents/{agent_type}/{agent_name}/submissions"
STREAM = "/api/agents/{agent_type}/{agent_name}/requests/{request_id}/stream"


def document(app: Flask) -> dict[str, Any]:
    found = app.test_client().get("/api/openapi.json").json
    assert isinstance(found, dict)
    return found


def parameter(doc: dict[str, Any], path: str, method: str, name: str) -> dict[str, Any]:
    for item in doc["paths"][path][method]["parameters"]:
        if item["name"] == name:
            schema: dict[str, Any] = item["schema"]
            return schema
    raise AssertionError(f"{method} {path} documents no parameter {name}")


def body_field(doc: dict[str, Any], model: str, name: str) -> dict[str, Any]:
    schema = doc["components"]["schemas"][model]["properties"][name]
    (text,) = [option for option in schema.get("anyOf", [schema]) if option.get("type") == "string"]
    found: dict[str, Any] = text
    return found


def allowed(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    """Strings the schema allows (pattern and lengths)."""
    low, high = schema.get("minLength", 0), schema.get("maxLength", 10**6)
    found = st.from_regex(schema["pattern"], fullmatch=True)
    return found.filter(lambda value: low <= len(value) <= high)


def refused(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    """Header-safe strings the schema does not allow (latin-1, no CR/LF: what HTTP carries)."""
    pattern = re.compile(schema["pattern"])
    high = schema.get("maxLength", 10**6)
    text = st.text(st.characters(min_codepoint=32, max_codepoint=255), min_size=1, max_size=40)
    special = st.sampled_from([".", "..", "a/b", "\u00d7\u00f8", "x y", "\u00b2", "1" * 300])
    return (text | special).filter(lambda value: not pattern.fullmatch(value) or len(value) > high)


def in_a_segment(strategy: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Values one path segment can carry: a "/" (even as %2F) splits the path, so the router
    answers 404 before any view; that refusal is the router's, not the schema's."""
    return strategy.filter(lambda value: "/" not in value)


def path_safe(value: str) -> str:
    """Quote everything, dots included (a client would not send ``..`` as a segment)."""
    return quote(value, safe="").replace(".", "%2E")


def check(strategy: st.SearchStrategy[str], probe: Callable[[str], int], ok: set[int]) -> None:
    @FUZZ
    @given(value=strategy)
    def run(value: str) -> None:
        status = probe(value)
        assert status in ok, (value, status)

    run()


def test_idempotency_key_header(app: Flask, client: FlaskClient) -> None:
    schema = parameter(document(app), SUBMISSIONS, "post", "Idempotency-Key")

    def post(value: str) -> int:
        url = agent_url(rest="/submissions")
        headers = {**FULL, "Idempotency-Key": value}
        return client.post(url, headers=headers, json={"messages": [user("x")]}).status_code

    check(allowed(schema), post, {200, 202})
    check(refused(schema), post, {400})


def test_last_event_id_header(app: Flask, client: FlaskClient) -> None:
    schema = parameter(document(app), STREAM, "get", "Last-Event-ID")
    body = {"messages": [user("x")], "submission_id": "s-1"}
    assert client.post(agent_url(rest="/submissions"), headers=FULL, json=body).status_code == 202

    def get(value: str) -> int:
        url = agent_url(rest="/requests/s-1/stream")
        response = client.get(url, headers={**FULL, "Last-Event-ID": value})
        response.close()  # the stream itself is not read here: only whether it was refused
        return response.status_code

    check(allowed(schema), get, {200})
    check(refused(schema), get, {400})


def test_delivery_id_header(app: Flask, client: FlaskClient) -> None:
    doc = document(app)
    schema = parameter(doc, "/hooks/{agent_type}/{agent_name}", "post", "X-Delivery-Id")
    body = b'{"n": 1}'

    def deliver(value: str) -> int:
        headers = {"X-Signature-256": signature(WEBHOOK_SECRET, body), "X-Delivery-Id": value}
        url = "/hooks/Recorder/inbox"
        return client.post(
            url, data=body, headers=headers, content_type="application/json"
        ).status_code

    check(allowed(schema), deliver, {200, 202})
    check(refused(schema), deliver, {400})


@pytest.mark.parametrize("name", ["submission_id", "request_id"])
def test_path_ids(app: Flask, client: FlaskClient, name: str) -> None:
    path = STREAM if name == "request_id" else SUBMISSIONS + "/{submission_id}"
    schema = parameter(document(app), path, "get", name)
    rest = "/requests/{}/stream" if name == "request_id" else "/submissions/{}"

    def get(value: str) -> int:
        return client.get(agent_url(rest=rest.format(path_safe(value))), headers=FULL).status_code

    check(allowed(schema), get, {404})  # well-formed, but names nothing
    check(in_a_segment(refused(schema)), get, {400})


def test_path_agent_name(app: Flask, client: FlaskClient) -> None:
    schema = parameter(document(app), SUBMISSIONS, "get", "agent_name")

    def get(value: str) -> int:
        return client.get(
            f"/api/agents/Recorder/{path_safe(value)}/submissions", headers=FULL
        ).status_code

    check(allowed(schema), get, {200})
    check(in_a_segment(refused(schema)), get, {400})


@pytest.mark.parametrize("name", ["submission_id", "idempotency_key"])
def test_submit_body_ids(app: Flask, client: FlaskClient, name: str) -> None:
    schema = body_field(document(app), "SubmitBody", name)

    def post(value: str) -> int:
        body = json.dumps({"messages": [user("x")], name: value})
        url = agent_url(rest="/submissions")
        return client.post(
            url, headers=FULL, data=body, content_type="application/json"
        ).status_code

    check(allowed(schema), post, {200, 202})
    check(refused(schema), post, {400})
