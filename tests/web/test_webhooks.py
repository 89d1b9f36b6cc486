"""Webhooks: HMAC signature over the raw body, delivery-id idempotency, the agent's hook."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from tests.apps.agents import Recorder
from tests.support.builders import texts, wait_for_status
from tests.web.conftest import TEST_CONFIG
from tests.web.support import FULL, SECRET_KEY, WEBHOOK_SECRET
from think_jobs import Think, ThinkJobs
from think_jobs.messages import user_text_message
from think_jobs.models import ScriptedModel
from think_jobs.testing import worker
from web import create_app
from web.webhooks import signature

pytestmark = pytest.mark.parametrize("backend", ["sqlite"])
HOOK = "/hooks/Recorder/inbox"


class Tickets(Think):
    """Turns a ticket webhook into a short instruction instead of raw JSON."""

    def get_model(self) -> ScriptedModel:
        return ScriptedModel("ok")

    def webhook_to_messages(self, payload: Any, headers: Mapping[str, str]) -> Sequence[Any]:
        return [user_text_message(f"{headers['x-event']}: {payload['title']}")]


def deliver(
    client: FlaskClient,
    payload: object,
    *,
    delivery: str | None = "d-1",
    secret: str = WEBHOOK_SECRET,
    url: str = HOOK,
    headers: Mapping[str, str] | None = None,
) -> TestResponse:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    sent = {"X-Signature-256": signature(secret, body), **(headers or {})}
    if delivery is not None:
        sent["X-Delivery-Id"] = delivery
    return client.post(url, data=body, headers=sent, content_type="application/json")


def stored(jobs: ThinkJobs, agent_type: type[Think] = Recorder) -> list[Any]:
    return jobs.get_agent(agent_type, "inbox").list_submissions()


def test_signed_delivery_becomes_a_submission(client: FlaskClient, web_jobs: ThinkJobs) -> None:
    response = deliver(client, {"b": 2, "a": 1})
    assert response.status_code == 202
    body = response.json
    assert body is not None and body["accepted"] is True and body["status"] == "pending"
    (submission,) = stored(web_jobs)
    assert submission.submission_id == body["submission_id"]
    assert submission.idempotency_key == "d-1"
    assert submission.metadata == {"source": "webhook", "delivery_id": "d-1"}


def test_redelivery_is_200_with_the_same_submission(
    client: FlaskClient, web_jobs: ThinkJobs
) -> None:
    first = deliver(client, {"n": 1})
    replay = deliver(client, {"n": 1})
    assert (first.status_code, replay.status_code) == (202, 200)
    assert replay.json["submission_id"] == first.json["submission_id"]  # type: ignore[index]
    assert replay.json["accepted"] is False  # type: ignore[index]
    assert len(stored(web_jobs)) == 1


@pytest.mark.parametrize(
    "tamper",
    ["no signature", "wrong secret", "other body", "not hex", "no prefix"],
)
def test_bad_signatures_are_401_and_store_nothing(
    client: FlaskClient, web_jobs: ThinkJobs, tamper: str
) -> None:
    body = b'{"n": 1}'
    good = signature(WEBHOOK_SECRET, body)
    header = {
        "no signature": None,
        "wrong secret": signature("guess", body),
        "other body": signature(WEBHOOK_SECRET, b'{"n": 2}'),
        "not hex": "sha256=zz",
        "no prefix": good.removeprefix("sha256="),
    }[tamper]
    headers = {"X-Delivery-Id": "d-1"}
    if header is not None:
        headers["X-Signature-256"] = header
    response = client.post(HOOK, data=body, headers=headers, content_type="application/json")
    assert response.status_code == 401
    assert response.json["error"]["type"] == "invalid_signature"  # type: ignore[index]
    assert stored(web_jobs) == []
    assert client.get("/api/agents", headers=FULL).json["agents"] == []  # type: ignore[index]


def test_missing_delivery_id_bad_json_unknown_agent(
    client: FlaskClient, web_jobs: ThinkJobs
) -> None:
    missing = deliver(client, {"n": 1}, delivery=None)
    assert missing.status_code == 400
    assert missing.json["error"]["type"] == "missing_delivery"  # type: ignore[index]
    bad_json = deliver(client, b"{not json")
    assert bad_json.status_code == 400
    assert bad_json.json["error"]["type"] == "invalid_json"  # type: ignore[index]
    deep = deliver(client, b"[" * 100_000)
    assert deep.status_code == 400
    unknown = deliver(client, {"n": 1}, url="/hooks/Nope/inbox")
    assert unknown.status_code == 404
    assert stored(web_jobs) == []


def test_too_large_delivery_is_413(client: FlaskClient, web_jobs: ThinkJobs) -> None:
    response = deliver(client, {"x": "y" * web_jobs.settings.max_request_bytes})
    assert response.status_code == 413


def test_agent_hook_and_configured_delivery_header(make_jobs: Callable[..., ThinkJobs]) -> None:
    jobs = make_jobs(
        webhook_secret=WEBHOOK_SECRET,
        webhook_delivery_header="X-GitHub-Delivery",
        secret_key=SECRET_KEY,
    )
    jobs.register(Tickets)
    client = create_app(jobs, TEST_CONFIG).test_client()
    url = "/hooks/Tickets/inbox"
    default_header = deliver(client, {"title": "t"}, url=url)
    assert default_header.status_code == 400  # X-Delivery-Id is not the configured header
    response = deliver(
        client,
        {"title": "Printer on fire"},
        url=url,
        delivery=None,
        headers={"X-GitHub-Delivery": "gh-1", "X-Event": "issue"},
    )
    assert response.status_code == 202
    (submission,) = stored(jobs, Tickets)
    assert submission.idempotency_key == "gh-1"
    agent = jobs.get_agent(Tickets, "inbox")
    with worker(jobs):
        wait_for_status(agent, submission.submission_id, "completed")
    assert texts(agent) == [("user", "issue: Printer on fire"), ("assistant", "ok")]


def test_unconfigured_webhooks_are_404(make_jobs: Callable[..., ThinkJobs]) -> None:
    jobs = make_jobs(secret_key=SECRET_KEY)
    jobs.register(Recorder)
    client = create_app(jobs, TEST_CONFIG).test_client()
    assert deliver(client, {"n": 1}).status_code == 404
    assert jobs.get_agent(Recorder, "inbox").list_submissions() == []
