"""``/api/agents/<type>/<name>/requests/<request_id>``: the SSE stream of a turn, and cancel.

Works for every turn (submissions, ``chat``, ``save_messages``...): the request id names it.
"""

from __future__ import annotations

from flask import Response, request

from think_jobs import Think, submissions
from think_jobs.streaming import decode_event
from web import auth, params, sse
from web.errors import ApiError
from web.extension import current_extension
from web.openapi import SSE, api_blueprint, operation
from web.schemas import CancelBody, RequestCancelled, StreamQuery

bp = api_blueprint("think_jobs_api_streams", __name__)

BASE = "/agents/<agent_type>/<agent_name>/requests/<request_id>"


@bp.get(BASE + "/stream")
@operation(
    summary="Stream a turn as SSE (AI SDK UI message stream v1); honours Last-Event-ID",
    tag="streams",
    query=StreamQuery,
    headers={"Last-Event-ID": "Resume after this seq (sent by EventSource on reconnect)."},
    responses={200: SSE},
)
@auth.requires(auth.READ)
def stream(agent_type: str, agent_name: str, request_id: str) -> Response:
    agent = params.agent(agent_type, agent_name)
    request_id = params.identifier(request_id, "path.request_id")
    source = stream_source(agent, request_id)
    resume = [
        params.query(StreamQuery).after_seq,
        sse.parse_event_id(request.headers.get("Last-Event-ID")),
    ]
    after_seq = max((seq for seq in resume if seq is not None), default=None)
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
    turn = submissions.find_turn(agent, request_id)
    return None if turn is None else turn.status


def stream_source(agent: Think, request_id: str) -> sse.StreamSource:
    """Bind the agent's stream of ``request_id``; 404 when neither a turn nor events exist."""
    jobs = agent.jobs
    buffer = jobs.keys.stream_buffer(agent.address, request_id)
    if stored_status(agent, request_id) is None and not jobs.redis.exists(buffer):
        raise ApiError(404, f"no request {request_id!r} for agent {agent.address}")

    def done_seq() -> int | None:
        raw = jobs.redis.lindex(buffer, -1)
        event = None if raw is None else decode_event(raw)
        return event.seq if event is not None and event.done else None

    return sse.StreamSource(
        follow=lambda after, timeout_s: agent.stream(request_id, after, timeout_s),
        status=lambda: stored_status(agent, request_id),
        done_seq=done_seq,
    )
