"""``/api/agents/<type>/<name>/requests/<request_id>``: the SSE stream of a turn, and cancel.

Works for every turn (submissions, ``chat``, ``save_messages``...): the request id names it.
"""

from __future__ import annotations

from collections.abc import Iterator

from flask import Response, request

from think_jobs import StreamEvent, Think, UnknownRequestError
from web import auth, params, sse
from web.current import current_extension
from web.errors import ApiError
from web.openapi import SSE, api_blueprint, operation
from web.schemas import CancelBody, ErrorBody, RequestCancelled, StreamQuery

bp = api_blueprint("think_jobs_api_streams", __name__)

BASE = "/agents/<agent_type>/<agent_name>/requests/<request_id>"


@bp.get(BASE + "/stream")
@operation(
    summary="Stream a turn as SSE (AI SDK UI message stream v1); honours Last-Event-ID",
    tag="streams",
    query=StreamQuery,
    headers={"Last-Event-ID": "Resume after this seq (sent by EventSource on reconnect)."},
    responses={200: SSE, 409: ErrorBody},
    description=(
        "409 stream_reset: the seq to resume after is past the end of the turn's stream, "
        "which has ended (its buffer was lost and rebuilt from the stored reply, numbered "
        "from 0 again); read the stream from its start or the reply from /messages."
    ),
)
@auth.requires(auth.READ)
def stream(agent_type: str, agent_name: str, request_id: str) -> Response:
    agent = params.agent(agent_type, agent_name)
    request_id = params.identifier(request_id, "path.request_id")
    resume = [
        params.query(StreamQuery).after_seq,
        sse.parse_event_id(request.headers.get("Last-Event-ID")),
    ]
    after_seq = max((seq for seq in resume if seq is not None), default=None)
    source = stream_source(agent, request_id, after_seq)
    limits = current_extension().stream_limits()
    return sse.response(sse.events(source, after_seq=after_seq, limits=limits))


@bp.post(BASE + "/cancel")
@operation(
    summary="Cancel a turn by request id (a no-op if unknown or finished)",
    tag="streams",
    body=CancelBody,
    responses={202: RequestCancelled},
)
@auth.requires(auth.WRITE)
def cancel(agent_type: str, agent_name: str, request_id: str) -> Response:
    agent = params.agent(agent_type, agent_name)
    request_id = params.identifier(request_id, "path.request_id")
    body = params.json_body(CancelBody, optional=True)
    agent.cancel_chat(request_id, body.reason)
    return params.model_response(RequestCancelled(request_id=request_id), 202)


def stored_status(agent: Think, request_id: str) -> str | None:
    """The turn's status in the database (None: no such turn)."""
    return agent.request_status(request_id)


def stream_source(agent: Think, request_id: str, after_seq: int | None) -> sse.StreamSource:
    """Bind the agent's stream of ``request_id``. Its first window is opened now, so an unknown
    request is a 404, a resume past the end of a stream that has ended a 409 ``stream_reset``
    (``StreamResetError``) and an unreachable Redis a 503 before the response starts."""
    heartbeat_s = current_extension().stream_limits().heartbeat_s
    try:
        first = agent.stream(request_id, after_seq, heartbeat_s)
    except UnknownRequestError:
        raise ApiError(404, f"no request {request_id!r} for agent {agent.address}") from None
    opened = [first]

    def follow(after: int, timeout_s: float) -> Iterator[StreamEvent]:
        if opened:
            return opened.pop()
        return agent.stream(request_id, after, timeout_s)

    return sse.StreamSource(follow=follow)
