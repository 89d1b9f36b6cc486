"""``/api/agents/<type>/<name>/submissions``: submit, list, inspect, cancel and delete."""

from __future__ import annotations

from flask import Response, request, url_for

from think_jobs import SubmissionInspection, SubmitMessagesResult, Think
from web import auth, params
from web.errors import ApiError
from web.openapi import api_blueprint, operation
from web.schemas import (
    CancelBody,
    DeleteManyQuery,
    DeleteResult,
    ErrorBody,
    ListQuery,
    SubmissionList,
    SubmitBody,
)

bp = api_blueprint("think_jobs_api_submissions", __name__)

BASE = "/agents/<agent_type>/<agent_name>/submissions"
ONE = BASE + "/<submission_id>"
IDEMPOTENCY_HEADER = "Idempotency-Key"


@bp.get(BASE)
@operation(
    summary="List submissions, newest first",
    tag="submissions",
    query=ListQuery,
    responses={200: SubmissionList},
)
@auth.requires(auth.READ)
def list_submissions(agent_type: str, agent_name: str) -> Response:
    agent = params.agent(agent_type, agent_name)
    found = params.query(ListQuery)
    page = agent.page_submissions(status=found.status, limit=found.limit, before=found.before)
    return params.model_response(
        SubmissionList(submissions=page.rows, next_before=page.next_before)
    )


@bp.post(BASE)
@operation(
    summary="Submit messages for a turn (202 new, 200 duplicate)",
    tag="submissions",
    body=SubmitBody,
    headers={IDEMPOTENCY_HEADER: "Same as the idempotency_key field; they must agree."},
    responses={200: SubmitMessagesResult, 202: SubmitMessagesResult, 409: ErrorBody},
)
@auth.requires(auth.WRITE)
def submit(agent_type: str, agent_name: str) -> Response:
    agent = params.agent(agent_type, agent_name)
    body = params.json_body(SubmitBody)
    result = agent.submit_messages(
        body.messages,
        submission_id=body.submission_id,
        idempotency_key=_idempotency_key(body),
        metadata=body.metadata,
    )
    response = params.model_response(result, 202 if result.accepted else 200)
    response.headers["Location"] = url_for(
        ".inspect",
        agent_type=agent_type,
        agent_name=agent_name,
        submission_id=result.submission_id,
    )
    return response


def _idempotency_key(body: SubmitBody) -> str | None:
    header = request.headers.get(IDEMPOTENCY_HEADER)
    if header is None:
        return body.idempotency_key
    key = params.key(header, f"header.{IDEMPOTENCY_HEADER}")
    if body.idempotency_key not in (None, key):
        raise ApiError(400, "the Idempotency-Key header and the idempotency_key field differ")
    return key


@bp.delete(BASE)
@operation(
    summary="Delete terminal submissions (oldest completed first)",
    tag="submissions",
    query=DeleteManyQuery,
    responses={200: DeleteResult},
)
@auth.requires(auth.WRITE)
def delete_many(agent_type: str, agent_name: str) -> Response:
    agent = params.agent(agent_type, agent_name)
    found = params.query(DeleteManyQuery)
    deleted = agent.delete_submissions(
        status=found.status, completed_before=found.completed_before, limit=found.limit
    )
    return params.model_response(DeleteResult(deleted=deleted))


@bp.get(ONE)
@operation(summary="Inspect a submission", tag="submissions", responses={200: SubmissionInspection})
@auth.requires(auth.READ)
def inspect(agent_type: str, agent_name: str, submission_id: str) -> Response:
    agent = params.agent(agent_type, agent_name)
    return params.model_response(existing(agent, submission_id))


@bp.delete(ONE)
@operation(
    summary="Delete a terminal submission (409 while pending or running)",
    tag="submissions",
    responses={204: None, 409: ErrorBody},
)
@auth.requires(auth.WRITE)
def delete_one(agent_type: str, agent_name: str, submission_id: str) -> Response:
    agent = params.agent(agent_type, agent_name)
    submission_id = params.identifier(submission_id, "path.submission_id")
    if not agent.delete_submission(submission_id):
        found = existing(agent, submission_id)
        raise ApiError(
            409,
            f"submission {submission_id} is {found.status.value}; only finished "
            "(completed, error, aborted, skipped) submissions can be deleted",
            type="submission_active",
        )
    return Response(status=204)


@bp.post(ONE + "/cancel")
@operation(
    summary="Cancel a submission (a no-op once it finished)",
    tag="submissions",
    body=CancelBody,
    responses={200: SubmissionInspection},
)
@auth.requires(auth.WRITE)
def cancel(agent_type: str, agent_name: str, submission_id: str) -> Response:
    agent = params.agent(agent_type, agent_name)
    body = params.json_body(CancelBody, optional=True)
    existing(agent, submission_id)
    agent.cancel_submission(submission_id, body.reason)
    return params.model_response(existing(agent, submission_id))


def existing(agent: Think, submission_id: str) -> SubmissionInspection:
    """The submission, or 404."""
    submission_id = params.identifier(submission_id, "path.submission_id")
    found = agent.inspect_submission(submission_id)
    if found is None:
        raise ApiError(404, f"no submission {submission_id!r} for agent {agent.address}")
    return found
