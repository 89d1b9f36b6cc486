"""The OpenAPI 3.1 document, and a schemathesis fuzz run of the whole API against it."""

from __future__ import annotations

import os
from typing import Any

import pytest
import schemathesis
from flask import Flask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode
from schemathesis.core.result import Ok

from tests.web.conftest import TEST_CONFIG
from tests.web.support import FULL, keeps_its_flaw, sent_as_generated
from think_jobs import ThinkJobs
from web import create_app


def refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(refs(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(refs(item) for item in node))
    return set()


@pytest.mark.parametrize("backend", ["sqlite"])
def test_document_covers_every_json_route_with_resolvable_schemas(app: Flask) -> None:
    document = app.test_client().get("/api/openapi.json").json
    assert document is not None and document["openapi"] == "3.1.0"
    operations = {
        (method.upper(), path) for path, item in document["paths"].items() for method in item
    }
    assert operations == {
        ("GET", "/api/agents"),
        ("GET", "/api/agents/{agent_type}/{agent_name}/messages"),
        ("GET", "/api/agents/{agent_type}/{agent_name}/submissions"),
        ("POST", "/api/agents/{agent_type}/{agent_name}/submissions"),
        ("DELETE", "/api/agents/{agent_type}/{agent_name}/submissions"),
        ("GET", "/api/agents/{agent_type}/{agent_name}/submissions/{submission_id}"),
        ("DELETE", "/api/agents/{agent_type}/{agent_name}/submissions/{submission_id}"),
        ("POST", "/api/agents/{agent_type}/{agent_name}/submissions/{submission_id}/cancel"),
        ("GET", "/api/agents/{agent_type}/{agent_name}/approvals"),
        ("GET", "/api/agents/{agent_type}/{agent_name}/approvals/{approval_id}"),
        ("POST", "/api/agents/{agent_type}/{agent_name}/approvals/{approval_id}"),
        ("GET", "/api/agents/{agent_type}/{agent_name}/requests/{request_id}/stream"),
        ("POST", "/api/agents/{agent_type}/{agent_name}/requests/{request_id}/cancel"),
        ("POST", "/api/agents/{agent_type}/chat"),
        ("GET", "/api/agents/{agent_type}/chat/{agent_name}/stream"),
        ("POST", "/api/agents/{agent_type}/chat/{agent_name}/stop"),
        ("POST", "/hooks/{agent_type}/{agent_name}"),
        ("GET", "/healthz"),
    }
    schemas = document["components"]["schemas"]
    for ref in refs(document):
        assert ref.removeprefix("#/components/schemas/") in schemas, ref
    submit = document["paths"]["/api/agents/{agent_type}/{agent_name}/submissions"]["post"]
    assert submit["security"] == [{"bearerAuth": []}]
    assert set(submit["responses"]) >= {"200", "202", "400", "401", "403", "409", "413"}
    assert schemas["SubmitBody"]["properties"]["messages"]["items"] == {
        "$ref": "#/components/schemas/UIMessage"
    }
    stream = document["paths"]["/api/agents/{agent_type}/{agent_name}/requests/{request_id}/stream"]
    assert "text/event-stream" in stream["get"]["responses"]["200"]["content"]


def one_idempotency_key(case: Case[Any]) -> bool:
    """The document cannot say that the header and the field must agree (400 otherwise)."""
    header = case.headers.get("Idempotency-Key") if case.headers else None
    field = case.body.get("idempotency_key") if isinstance(case.body, dict) else None
    return header is None or field is None or header == field


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["postgres"])
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_fuzz_the_api_against_its_document(web_jobs: ThinkJobs, mode: GenerationMode) -> None:
    """No 500s, and every answer matches the document (status, content type, body).

    (schemathesis' own pytest plugin does not run on pytest 9; its strategies do.)
    """
    config = {
        **TEST_CONFIG,
        "THINK_JOBS_SSE_HEARTBEAT_S": 0.1,
        "THINK_JOBS_SSE_MAX_DURATION_S": 0.3,
    }
    schema = schemathesis.openapi.from_wsgi("/api/openapi.json", create_app(web_jobs, config))
    # A negative body may also be over the size limit: 413 is a refusal the document names
    # for every operation with a body (schemathesis' default list leaves it out; seen in CI).
    rejection = schema.config.checks.negative_data_rejection
    rejection.expected_statuses = [*rejection.expected_statuses, "413"]
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result.err()
        operations.append(result.ok())
    assert len(operations) == 18

    strategies = [op.as_strategy(generation_mode=mode) for op in operations]

    @given(
        case=st.one_of(*strategies)
        .filter(one_idempotency_key)
        .filter(keeps_its_flaw)
        .filter(sent_as_generated)
    )
    @settings(
        max_examples=int(os.environ.get("FUZZ_EXAMPLES", "200")),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def exchange(case: Case[Any]) -> None:
        case.call_and_validate(headers=FULL)

    exchange()
