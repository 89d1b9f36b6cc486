"""``POST /hooks/<agent_type>/<agent_name>``: signed deliveries become durable submissions.

The sender signs the raw body: ``X-Signature-256: sha256=<hex HMAC-SHA256(secret, body)>``
(``THINK_JOBS_WEBHOOK_SECRET``), and names the delivery in ``THINK_JOBS_WEBHOOK_DELIVERY_HEADER``
(default ``X-Delivery-Id``), which becomes the submission's idempotency key: a redelivery
answers 200 with the submission it already made. The agent's ``webhook_to_messages(payload,
headers)`` turns the JSON payload into messages (default: the JSON text as a user message).
Nothing is parsed or stored before the signature checks out.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from flask import Response, request
from pydantic import SecretStr

from think_jobs import SubmitMessagesResult
from web import auth, params
from web.errors import ApiError
from web.extension import current_extension
from web.openapi import api_blueprint, operation

bp = api_blueprint("think_jobs_webhooks", __name__)

SIGNATURE_HEADER = "X-Signature-256"


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
    """The ``X-Signature-256`` value a sender computes for ``body``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@bp.post("/<agent_type>/<agent_name>")
@operation(
    summary="Receive a signed webhook delivery as a submission (202 new, 200 redelivery)",
    tag="webhooks",
    headers={"X-Delivery-Id": "The delivery id (header name: THINK_JOBS_WEBHOOK_DELIVERY_HEADER)"},
    responses={200: SubmitMessagesResult, 202: SubmitMessagesResult},
)
@auth.marked(auth.SIGNED)
def receive(agent_type: str, agent_name: str) -> Response:
    settings = current_extension().jobs.settings
    raw = request.get_data(cache=True)
    verify(settings.webhook_secret, raw)
    delivery_id = _delivery_id(settings.webhook_delivery_header)
    payload = _payload(raw)
    agent = params.agent(agent_type, agent_name)
    messages = agent.webhook_to_messages(payload, HeaderMap(request.headers.items()))
    result = agent.submit_messages(
        messages,
        idempotency_key=delivery_id,
        metadata={"source": "webhook", "delivery_id": delivery_id},
    )
    return params.model_response(result, 202 if result.accepted else 200)


def verify(secret: SecretStr | None, raw: bytes) -> None:
    """401 unless the signature header is the HMAC of exactly these bytes."""
    if secret is None:
        raise ApiError(
            404, "webhooks are not configured (THINK_JOBS_WEBHOOK_SECRET)", type="not_found"
        )
    presented = request.headers.get(SIGNATURE_HEADER, "").strip().encode()
    expected = signature(secret.get_secret_value(), raw).encode()
    if not hmac.compare_digest(presented, expected):
        raise ApiError(401, f"missing or invalid {SIGNATURE_HEADER}", type="invalid_signature")


def _delivery_id(header: str) -> str:
    value = request.headers.get(header)
    if value is None:
        raise ApiError(400, f"missing {header} header (the delivery id)", type="missing_delivery")
    return params.identifier(value, f"header.{header}")


def _payload(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise ApiError(400, f"payload is not JSON: {error}", type="invalid_json") from None
