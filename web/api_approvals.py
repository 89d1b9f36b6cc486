"""``/api/agents/<type>/<name>/approvals``: list the agent's tool approvals and answer one.

An answer (``approved``, an optional ``reason``) closes an open approval; once every approval
of the turn is answered, the continuation runs on a worker (the tool runs, or the model is told
it was denied). The same answer sent again is a no-op (200, the approval as stored); a
different answer to a closed approval is a 409 that says how it was closed. Only the public
``think_jobs`` API is used here.
"""

from __future__ import annotations

from flask import Response

from think_jobs import Approval, Think, UnknownApprovalError
from web import auth, params
from web.errors import ApiError
from web.openapi import api_blueprint, operation
from web.schemas import ApprovalAnswer, ApprovalList, ApprovalQuery, ErrorBody

bp = api_blueprint("think_jobs_api_approvals", __name__)

BASE = "/agents/<agent_type>/<agent_name>/approvals"
ONE = BASE + "/<approval_id>"


@bp.get(BASE)
@operation(
    summary="List the agent's tool approvals, oldest first",
    tag="approvals",
    query=ApprovalQuery,
    responses={200: ApprovalList},
)
@auth.requires(auth.READ)
def list_approvals(agent_type: str, agent_name: str) -> Response:
    agent = params.agent(agent_type, agent_name)
    found = params.query(ApprovalQuery)
    statuses = None if found.status is None else [status.value for status in found.status]
    return params.model_response(ApprovalList(approvals=agent.list_approvals(status=statuses)))


@bp.get(ONE)
@operation(
    summary="Inspect a tool approval",
    tag="approvals",
    responses={200: Approval, 404: ErrorBody},
)
@auth.requires(auth.READ)
def inspect(agent_type: str, agent_name: str, approval_id: str) -> Response:
    agent = params.agent(agent_type, agent_name)
    return params.model_response(existing(agent, approval_id))


@bp.post(ONE)
@operation(
    summary="Approve or deny a tool call (the same answer again is a no-op; 409 if closed)",
    tag="approvals",
    body=ApprovalAnswer,
    responses={200: Approval, 404: ErrorBody, 409: ErrorBody},
)
@auth.requires(auth.WRITE)
def respond(agent_type: str, agent_name: str, approval_id: str) -> Response:
    agent = params.agent(agent_type, agent_name)
    answer = params.json_body(ApprovalAnswer)
    existing(agent, approval_id)
    stored = agent.respond_to_approval(approval_id, answer.approved, answer.reason)
    if stored.status.value != ("approved" if answer.approved else "denied"):
        raise conflict(stored)
    return params.model_response(stored)


def conflict(stored: Approval) -> ApiError:
    """A closed approval answered differently than it was closed."""
    because = f" ({stored.reason})" if stored.reason else ""
    return ApiError(
        409,
        f"approval {stored.approval_id} is already {stored.status.value}{because}",
        type="approval_closed",
        details={"status": stored.status.value},
    )


def existing(agent: Think, approval_id: str) -> Approval:
    """The approval, or 404."""
    approval_id = params.identifier(approval_id, "path.approval_id")
    found = agent.get_approval(approval_id)
    if found is None:
        raise UnknownApprovalError(f"no approval {approval_id!r} for agent {agent.address}")
    return found
