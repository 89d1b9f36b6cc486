"""``POST /hooks/<agent_type>/<agent_name>``: signed deliveries become durable submissions.

Two signature schemes, chosen by ``THINK_JOBS_WEBHOOK_SCHEME``; both sign the raw body, all of
it (``web.security`` refuses, never truncates, a body over the limit):

- ``github`` (the default): ``X-Signature-256: sha256=<hex HMAC-SHA256(secret, body)>``, and
  the delivery id in ``THINK_JOBS_WEBHOOK_DELIVERY_HEADER`` (default ``X-Delivery-Id``). The
  id is not signed, so a captured delivery can be sent again under a new id: prefer
  ``standard`` wherever the sender can do it.
- ``standard`` (Standard Webhooks, as Svix and OpenAI send them): ``webhook-id``,
  ``webhook-timestamp`` (Unix seconds) and ``webhook-signature`` (space-separated
  ``v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>``; the key is the base64 after
  ``whsec_``, or the secret's UTF-8 bytes). The delivery id is signed, a timestamp further than
  ``THINK_JOBS_WEBHOOK_TOLERANCE_S`` (300 s) from now is refused, and a delivery id is claimed
  in Redis by the first agent it reaches (for the window the timestamp allows), so a capture
  sent to another agent is refused too (409). Redis down: 503, the sender retries.

``THINK_JOBS_WEBHOOK_SECRET`` signs; ``THINK_JOBS_WEBHOOK_PREVIOUS_SECRETS`` (comma-separated)
are still accepted while senders rotate. The delivery id becomes the submission's idempotency
key: a redelivery answers 200 with the submission it already made. The agent's
``webhook_to_messages(payload, headers)`` turns the JSON payload into messages (default: the
JSON text as a user message). Nothing is parsed or stored before the signature checks out.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from flask import Response, request

from think_jobs import SubmitMessagesResult, Think
from think_jobs.errors import ConfigurationError
from think_jobs.settings import Settings
from web import auth, params
from web.current import current_extension
from web.errors import ApiError
from web.openapi import api_blueprint, operation
from web.schemas import WEBHOOK_TIMESTAMP_PATTERN, ErrorBody

bp = api_blueprint("think_jobs_webhooks", __name__)

SIGNATURE_HEADER = "X-Signature-256"
STANDARD_ID = "webhook-id"
STANDARD_TIMESTAMP = "webhook-timestamp"
STANDARD_SIGNATURE = "webhook-signature"
SECRET_PREFIX = "whsec_"
_TIMESTAMP = re.compile(WEBHOOK_TIMESTAMP_PATTERN)


class HeaderMap(Mapping[str, str]):
    """Request headers for ``webhook_to_messages``: case-insensitive, read-only."""

    def __init__(self, items: Iterable[tuple[str, str]]) -> None:
        self._items = {name.lower(): (name, value) for name, value in items}

    def __getitem__(self, name: str) -> str:
        return self._items[name.lower()][1]

    def __iter__(self) -> Iterator[str]:
        return (name for name, _value in self._items.values())

    def __len__(self) -> int:
        return len(self._items)


def signature(secret: str, body: bytes) -> str:
    """The ``X-Signature-256`` value a GitHub-style sender computes for ``body``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def standard_signature(secret: str, delivery_id: str, timestamp: int | str, body: bytes) -> str:
    """One ``webhook-signature`` entry (``v1,<base64>``) a Standard Webhooks sender computes."""
    signed = f"{delivery_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key_bytes(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def secret_key_bytes(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret: ``whsec_<base64>`` decoded, else UTF-8."""
    if not secret.startswith(SECRET_PREFIX):
        return secret.encode()
    try:
        return base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except binascii.Error as error:
        raise ConfigurationError(
            f"a webhook secret starting with {SECRET_PREFIX} must be base64 after it"
        ) from error


def webhook_headers() -> Mapping[str, str]:
    """The headers a delivery carries under the configured scheme (for the OpenAPI document)."""
    settings = current_extension().jobs.settings
    if settings.webhook_scheme == "standard":
        return {
            STANDARD_ID: "The delivery id (signed; it becomes the idempotency key).",
            STANDARD_TIMESTAMP: "Unix seconds when it was sent (within the tolerance of now).",
        }
    return {settings.webhook_delivery_header: "The delivery id (the idempotency key)."}


@bp.post("/<agent_type>/<agent_name>")
@operation(
    summary="Receive a signed webhook delivery as a submission (202 new, 200 redelivery)",
    tag="webhooks",
    dynamic_headers=webhook_headers,
    responses={200: SubmitMessagesResult, 202: SubmitMessagesResult, 409: ErrorBody},
)
@auth.marked(auth.SIGNED)
def receive(agent_type: str, agent_name: str) -> Response:
    settings = current_extension().jobs.settings
    raw = request.get_data(cache=True)
    delivery_id = verified_delivery(settings, raw)
    payload = _payload(raw)
    agent = params.agent(agent_type, agent_name)
    if settings.webhook_scheme == "standard":
        claim(agent, delivery_id, ttl_s=2 * settings.webhook_tolerance_s + 1)
    messages = agent.webhook_to_messages(payload, HeaderMap(request.headers.items()))
    result = agent.submit_messages(
        messages,
        idempotency_key=delivery_id,
        metadata={"source": "webhook", "delivery_id": delivery_id},
    )
    return params.model_response(result, 202 if result.accepted else 200)


def verified_delivery(settings: Settings, raw: bytes) -> str:
    """The delivery id, once the signature over exactly ``raw`` checks out (401 if not)."""
    secrets = _secrets(settings)
    if settings.webhook_scheme == "standard":
        return _standard_delivery(secrets, raw, tolerance_s=settings.webhook_tolerance_s)
    verify(secrets, raw)
    return _delivery_id(settings.webhook_delivery_header)


def _secrets(settings: Settings) -> list[str]:
    if settings.webhook_secret is None:
        raise ApiError(
            404, "webhooks are not configured (THINK_JOBS_WEBHOOK_SECRET)", type="not_found"
        )
    previous = [secret.get_secret_value() for secret in settings.webhook_previous_secrets]
    return [settings.webhook_secret.get_secret_value(), *previous]


def verify(secrets: list[str], raw: bytes) -> None:
    """401 unless ``X-Signature-256`` is the HMAC of exactly these bytes with one secret."""
    presented = request.headers.get(SIGNATURE_HEADER, "").strip().encode()
    expected = [signature(secret, raw).encode() for secret in secrets]
    if not any([hmac.compare_digest(presented, value) for value in expected]):
        raise ApiError(401, f"missing or invalid {SIGNATURE_HEADER}", type="invalid_signature")


def _standard_delivery(secrets: list[str], raw: bytes, *, tolerance_s: int) -> str:
    delivery_id, timestamp, presented = (
        request.headers.get(name, "").strip()
        for name in (STANDARD_ID, STANDARD_TIMESTAMP, STANDARD_SIGNATURE)
    )
    if not (delivery_id and timestamp and presented):
        raise ApiError(401, _MISSING, type="invalid_signature")
    expected = [standard_signature(s, delivery_id, timestamp, raw) for s in secrets]
    if not _any_matches(presented.split(), expected):
        raise ApiError(401, f"invalid {STANDARD_SIGNATURE}", type="invalid_signature")
    _check_timestamp(timestamp, tolerance_s)
    return params.key(delivery_id, f"header.{STANDARD_ID}")


_MISSING = f"a delivery needs {STANDARD_ID}, {STANDARD_TIMESTAMP} and {STANDARD_SIGNATURE}"


def _any_matches(presented: list[str], expected: list[str]) -> bool:
    """Every presented ``v1,`` entry against every expected one, in constant time each."""
    results = [
        hmac.compare_digest(entry.encode(), value.encode())
        for entry in presented
        if entry.startswith("v1,")
        for value in expected
    ]
    return any(results)


def _check_timestamp(timestamp: str, tolerance_s: int) -> None:
    """A signed timestamp further than ``tolerance_s`` from now is an old capture (or a
    sender whose clock is off): 401."""
    if not _TIMESTAMP.fullmatch(timestamp):
        raise ApiError(401, f"{STANDARD_TIMESTAMP} must be Unix seconds", type="invalid_signature")
    skew_s = int(timestamp) - int(time.time())
    if abs(skew_s) > tolerance_s:
        when = "old" if skew_s < 0 else "far in the future"
        raise ApiError(
            401,
            f"{STANDARD_TIMESTAMP} is {abs(skew_s)} s {when}; the tolerance is {tolerance_s} s "
            "(THINK_JOBS_WEBHOOK_TOLERANCE_S)",
            type="stale_delivery",
        )


def claim(agent: Think, delivery_id: str, *, ttl_s: int) -> None:
    """Bind a delivery id to the first agent it reaches (TTL: twice the tolerance, past which
    its signed timestamp is refused anyway); 409 at any other agent."""
    if agent.jobs.claim_webhook_delivery(delivery_id, agent.address, ttl_s=ttl_s) is not None:
        raise ApiError(
            409,
            f"delivery {delivery_id!r} was already delivered to another agent",
            type="delivery_conflict",
        )


def _delivery_id(header: str) -> str:
    value = request.headers.get(header)
    if value is None:
        raise ApiError(400, f"missing {header} header (the delivery id)", type="missing_delivery")
    return params.key(value, f"header.{header}")


def _payload(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise ApiError(400, f"payload is not JSON: {error}", type="invalid_json") from None
