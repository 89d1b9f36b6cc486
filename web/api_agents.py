"""``/api/agents``: which agents exist (with pending/running counts), and an agent's messages."""

from __future__ import annotations

from dataclasses import asdict

from flask import Response

from think_jobs.errors import StoredMessageError
from web import auth, params
from web.current import current_extension
from web.errors import unreadable_message
from web.openapi import api_blueprint, operation
from web.schemas import AgentList, AgentSummary, ErrorBody, MessageList

bp = api_blueprint("think_jobs_api_agents", __name__)


def agent_list() -> AgentList:
    jobs = current_extension().jobs
    rows = [AgentSummary.model_validate(asdict(row)) for row in jobs.list_agents()]
    return AgentList(agent_types=jobs.agent_types, agents=rows)


@bp.get("/agents")
@operation(
    summary="List agents with pending and running counts", tag="agents", responses={200: AgentList}
)
@auth.requires(auth.READ)
def list_agents() -> Response:
    return params.model_response(agent_list())


@bp.get("/agents/<agent_type>/<agent_name>/messages")
@operation(
    summary="An agent's conversation (AI SDK UIMessages); 409 if a stored one cannot be read",
    tag="agents",
    responses={200: MessageList, 409: ErrorBody},
)
@auth.requires(auth.READ)
def messages(agent_type: str, agent_name: str) -> Response:
    agent = params.agent(agent_type, agent_name)
    try:
        found = agent.get_messages()
    except StoredMessageError as error:
        raise unreadable_message(error, agent.agent_type, agent.name) from error
    return params.model_response(MessageList(messages=[m.to_wire() for m in found]))
