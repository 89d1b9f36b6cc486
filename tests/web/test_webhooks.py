"""Webhooks: HMAC signature over the raw body, delivery-id idempotency, the agent's hook."""

from __future__ import annotations

import base64
import json
import time
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
from web.webhooks import signature, standard_signature

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


# -- Standard Webhooks (issue 15, case 8): the delivery id and a timestamp are signed ---------

STANDARD_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OLD_SECRET = "whsec_" + base64.b64encode(b"the secret before the rotation").decode()


def test_the_server_accepts_the_standard_webhooks_test_vector(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    """The specification's published vector (signed in 2021, hence the wide tolerance here):
    a delivery from any Standard Webhooks library is accepted, and we sign as they do."""
    jobs = make_jobs(
        webhook_secret=STANDARD_SECRET,
        webhook_scheme="standard",
        webhook_tolerance_s=10**10,
        secret_key=SECRET_KEY,
    )
    jobs.register(Recorder)
    client = create_app(jobs, TEST_CONFIG).test_client()
    body = b'{"test": 2432232314}'
    vector = {
        "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "webhook-timestamp": "1614265330",
        "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
    }
    assert post(client, body, vector).status_code == 202
    assert (
        standard_signature(STANDARD_SECRET, vector["webhook-id"], 1614265330, body)
        == vector["webhook-signature"]
    )


@pytest.fixture
def standard(make_jobs: Callable[..., ThinkJobs]) -> tuple[ThinkJobs, FlaskClient]:
    jobs = make_jobs(
        webhook_secret=STANDARD_SECRET,
        webhook_previous_secrets=OLD_SECRET,
        webhook_scheme="standard",
        secret_key=SECRET_KEY,
    )
    jobs.register(Recorder)
    jobs.register(Tickets)
    return jobs, create_app(jobs, TEST_CONFIG).test_client()


def standard_headers(
    body: bytes,
    *,
    delivery: str = "msg_1",
    timestamp: int | None = None,
    secret: str = STANDARD_SECRET,
) -> dict[str, str]:
    sent_at = int(time.time()) if timestamp is None else timestamp
    return {
        "webhook-id": delivery,
        "webhook-timestamp": str(sent_at),
        "webhook-signature": standard_signature(secret, delivery, sent_at, body),
    }


def post(client: FlaskClient, body: bytes, headers: Mapping[str, str], url: str = HOOK) -> Any:
    return client.post(url, data=body, headers=dict(headers), content_type="application/json")


def test_a_standard_delivery_becomes_a_submission_keyed_by_its_signed_id(
    standard: tuple[ThinkJobs, FlaskClient],
) -> None:
    jobs, client = standard
    body = b'{"type": "ticket.created"}'
    headers = standard_headers(body)
    first = post(client, body, headers)
    assert first.status_code == 202, first.json
    again = post(client, body, headers)  # the sender retries the same delivery
    assert again.status_code == 200
    assert again.json["submission_id"] == first.json["submission_id"]
    (submission,) = stored(jobs)
    assert submission.idempotency_key == "msg_1"
    assert submission.metadata == {"source": "webhook", "delivery_id": "msg_1"}


def test_case_8_a_capture_replayed_under_a_new_delivery_id_is_refused(
    standard: tuple[ThinkJobs, FlaskClient],
) -> None:
    jobs, client = standard
    body = b'{"n": 1}'
    captured = standard_headers(body)
    assert post(client, body, captured).status_code == 202
    replayed = {**captured, "webhook-id": "msg_2"}
    response = post(client, body, replayed)
    assert response.status_code == 401
    assert response.json["error"]["type"] == "invalid_signature"
    assert len(stored(jobs)) == 1


@pytest.mark.parametrize("skew_s", [-301, -3600, 301])
def test_case_8_an_old_capture_is_refused(
    standard: tuple[ThinkJobs, FlaskClient], skew_s: int
) -> None:
    jobs, client = standard
    body = b'{"n": 1}'
    headers = standard_headers(body, timestamp=int(time.time()) + skew_s)
    response = post(client, body, headers)
    assert response.status_code == 401
    assert response.json["error"]["type"] == "stale_delivery"
    assert "THINK_JOBS_WEBHOOK_TOLERANCE_S" in response.json["error"]["message"]
    assert stored(jobs) == []


def test_case_8_a_capture_sent_to_another_agent_is_refused(
    standard: tuple[ThinkJobs, FlaskClient],
) -> None:
    jobs, client = standard
    body = b'{"title": "t"}'
    headers = standard_headers(body)
    assert post(client, body, headers).status_code == 202
    for url in ("/hooks/Recorder/elsewhere", "/hooks/Tickets/inbox"):
        response = post(client, body, headers, url=url)
        assert response.status_code == 409, url
        assert response.json["error"]["type"] == "delivery_conflict"
    assert jobs.get_agent(Recorder, "elsewhere").list_submissions() == []
    assert jobs.get_agent(Tickets, "inbox").list_submissions() == []


def test_several_signatures_and_the_previous_secret_are_accepted_during_rotation(
    standard: tuple[ThinkJobs, FlaskClient],
) -> None:
    jobs, client = standard
    body = b'{"n": 1}'
    now = int(time.time())
    wrong = standard_signature("whsec_" + base64.b64encode(b"nope").decode(), "msg_a", now, body)
    right = standard_signature(STANDARD_SECRET, "msg_a", now, body)
    several = {"webhook-id": "msg_a", "webhook-timestamp": str(now)}
    several["webhook-signature"] = f"v1a,abc {wrong} {right}"
    assert post(client, body, several).status_code == 202
    old = standard_headers(body, delivery="msg_b", secret=OLD_SECRET)
    assert post(client, body, old).status_code == 202
    retired = standard_headers(
        body, delivery="msg_c", secret="whsec_" + base64.b64encode(b"retired").decode()
    )
    assert post(client, body, retired).status_code == 401
    assert {s.idempotency_key for s in stored(jobs)} == {"msg_a", "msg_b"}


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_a_standard_delivery_without_its_headers_is_401(
    standard: tuple[ThinkJobs, FlaskClient], missing: str
) -> None:
    jobs, client = standard
    body = b'{"n": 1}'
    headers = {k: v for k, v in standard_headers(body).items() if k != missing}
    assert post(client, body, headers).status_code == 401
    assert stored(jobs) == []


def test_a_github_style_delivery_accepts_the_previous_secret_too(
    make_jobs: Callable[..., ThinkJobs],
) -> None:
    jobs = make_jobs(
        webhook_secret="new-secret", webhook_previous_secrets="old-secret", secret_key=SECRET_KEY
    )
    jobs.register(Recorder)
    client = create_app(jobs, TEST_CONFIG).test_client()
    assert deliver(client, {"n": 1}, secret="old-secret").status_code == 202
    assert deliver(client, {"n": 2}, secret="new-secret", delivery="d-2").status_code == 202
    assert deliver(client, {"n": 3}, secret="older", delivery="d-3").status_code == 401
