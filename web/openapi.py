"""The OpenAPI 3.1 document, built from the views' ``@operation`` notes and the pydantic models.

Paths come from the app's URL map, so the document is right wherever the blueprints are mounted
(``url_prefix``, ``SCRIPT_NAME``). Schemas come from ``web.schemas`` via ``models_json_schema``
with ``#/components/schemas/{model}`` references.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from flask import Blueprint, Flask, Response, current_app, jsonify, request
from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import models_json_schema
from werkzeug.routing import Rule

from think_jobs.limits import Limits
from think_jobs.validation import ID_MAX_CHARS, KEY_PATTERN
from web import auth, security
from web.current import current_extension
from web.errors import ApiError, register_json_errors
from web.schemas import (
    EVENT_ID_PATTERN,
    SCHEMA_MODELS,
    WEBHOOK_TIMESTAMP_PATTERN,
    AgentName,
    ErrorBody,
    Identifier,
)

OPERATION_ATTRIBUTE = "think_jobs_operation"
REF = "#/components/schemas/{model}"
SSE = "text/event-stream"
View = TypeVar("View", bound=Callable[..., Any])
Reply = type[BaseModel] | str | None  # a model (JSON), a media type, or no body
_ERRORS = {
    400: "Invalid input",
    401: "Missing or invalid credentials",
    403: "The credential lacks the scope (or the CSRF token is missing)",
    404: "Unknown agent type, submission or request",
    413: "Request body too large",
    415: "Request body is not JSON",
    503: "Database or Redis unavailable",
}
_ERRORS_BY_SCOPE = {
    auth.PUBLIC: (400, 503),
    auth.SIGNED: (400, 401, 404, 413, 503),
    auth.READ: (400, 401, 403, 404, 503),
    auth.WRITE: (400, 401, 403, 404, 503),
}
_BEARER = {"type": "http", "scheme": "bearer", "description": "API or read token"}
_SIGNATURES = {
    "github": ("X-Signature-256", "sha256=<hex HMAC-SHA256 of the raw body with the secret>"),
    "standard": (
        "webhook-signature",
        "Standard Webhooks: space-separated v1,<base64 HMAC-SHA256 of "
        "'<webhook-id>.<webhook-timestamp>.<raw body>'>",
    ),
}
# Header values as the server checks them: keys follow the core's rule, seqs are digits.
_KEY_HEADER = {"type": "string", "minLength": 1, "maxLength": ID_MAX_CHARS, "pattern": KEY_PATTERN}
_HEADER_SCHEMAS: Mapping[str, dict[str, Any]] = {
    "last-event-id": {"type": "string", "pattern": EVENT_ID_PATTERN},
    "webhook-timestamp": {"type": "string", "pattern": WEBHOOK_TIMESTAMP_PATTERN},
}
_PATH_PARAMS: Mapping[str, type[Any]] = {
    "agent_name": AgentName,
    "submission_id": Identifier,
    "request_id": Identifier,
    "approval_id": Identifier,
}


@dataclass(frozen=True)
class Operation:
    summary: str
    responses: Mapping[int, Reply]
    tag: str
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    description: str = ""
    dynamic_headers: Callable[[], Mapping[str, str]] | None = None  # read at document time

    def all_headers(self) -> Mapping[str, str]:
        """The documented request headers: name -> description."""
        dynamic = self.dynamic_headers() if self.dynamic_headers is not None else {}
        return {**self.headers, **dynamic}

    def __call__(self, view: View) -> View:
        """Used as a decorator: attach this description to the view."""
        setattr(view, OPERATION_ATTRIBUTE, self)
        return view


operation = Operation  # ``@operation(summary=..., responses=...)`` reads better on a view


def api_blueprint(name: str, import_name: str) -> Blueprint:
    """A blueprint of JSON endpoints: body limit, secure headers, JSON errors, and no query
    parameter the view's ``@operation`` does not declare."""
    blueprint = Blueprint(name, import_name)
    security.protect(blueprint)
    blueprint.before_request(reject_undeclared_query)
    register_json_errors(blueprint)
    return blueprint


def reject_undeclared_query() -> None:
    view = current_app.view_functions.get(request.endpoint or "")
    note = getattr(view, OPERATION_ATTRIBUTE, None)
    declared = set(note.query.model_fields) if isinstance(note, Operation) and note.query else set()
    unknown = sorted(set(request.args) - declared)
    if unknown:
        raise ApiError(400, f"unknown query parameters: {', '.join(map(repr, unknown))}")


bp = api_blueprint("think_jobs_api_docs", __name__)


@bp.get("/openapi.json")
@auth.marked(auth.PUBLIC)
def document() -> Response:
    return jsonify(build_document(current_app))


def build_document(app: Flask) -> dict[str, Any]:
    schemas = _Schemas()
    paths: dict[str, dict[str, Any]] = {}
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        view = app.view_functions.get(rule.endpoint)
        note = getattr(view, OPERATION_ATTRIBUTE, None)
        if view is None or not isinstance(note, Operation):
            continue
        item = paths.setdefault(_openapi_path(rule), {})
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            scope = auth.scope_of(view) or auth.PUBLIC
            item[method.lower()] = _operation(note, rule, scope, schemas)
    return {
        "openapi": "3.1.0",
        "info": {"title": "think-jobs", "version": "1"},
        "paths": paths,
        "components": {"schemas": schemas.definitions, "securitySchemes": _security_schemes()},
    }


class _Schemas:
    """Component schemas, collected as operations reference models."""

    def __init__(self) -> None:
        self.definitions: dict[str, Any] = {}
        self.refs: dict[type[BaseModel], dict[str, Any]] = {}
        self._add(SCHEMA_MODELS)

    def _add(self, models: tuple[type[BaseModel], ...]) -> None:
        keymap, found = models_json_schema([(m, "validation") for m in models], ref_template=REF)
        for name, definition in found.get("$defs", {}).items():
            self.definitions[name] = _with_limits(name, _tag_required(definition))
        for (model, _mode), ref in keymap.items():
            self.refs[cast(type[BaseModel], model)] = ref

    def ref(self, model: type[BaseModel]) -> dict[str, Any]:
        if model not in self.refs:
            self._add((model,))
        return dict(self.refs[model])

    def properties(self, model: type[BaseModel]) -> tuple[dict[str, Any], set[str]]:
        name = self.ref(model)["$ref"].rsplit("/", 1)[1]
        schema = self.definitions[name]
        return schema.get("properties", {}), set(schema.get("required", []))


def _tag_required(schema: dict[str, Any]) -> dict[str, Any]:
    """A part or chunk is told apart by ``type``: the core rejects one without it, even where
    the Python model has a default, so the document requires it."""
    tag = schema.get("properties", {}).get("type")
    if not isinstance(tag, dict) or "const" not in tag:
        return schema
    properties = {**schema["properties"], "type": {k: v for k, v in tag.items() if k != "default"}}
    required = sorted({*schema.get("required", []), "type"})
    return {**schema, "properties": properties, "required": required}


# The input limits the core applies (think_jobs.limits) that a JSON Schema can state, so
# the document and the server agree: the models themselves stay lenient, to read back rows
# stored before the limits existed.
_LABELS = ("toolCallId", "toolName", "sourceId", "mediaType", "type")
_NO_CONTROL = r"^[^\x00-\x1f\x7f]*$"
_LABEL_RULE = {"maxLength": ID_MAX_CHARS, "pattern": _NO_CONTROL}  # messages.py's rule


def _with_limits(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    properties = dict(schema.get("properties", {}))
    limits = Limits.of(current_extension().jobs.settings)
    for label in _LABELS:
        if label in properties:
            properties[label] = _string_limits(properties[label], **_LABEL_RULE)
    if name in ("UIMessage", "ChatMessage"):
        properties["parts"] = {**properties["parts"], "maxItems": limits.parts_per_message}
    if "id" in properties and name != "ChatMessage":  # a ChatMessage's id has the id rule
        properties["id"] = _string_limits(properties["id"], **_LABEL_RULE)
    if name == "SubmitBody":
        most = limits.messages_per_submission
        properties["messages"] = {**properties["messages"], "maxItems": most}
    return {**schema, "properties": properties} if properties else schema


def _string_limits(schema: dict[str, Any], **limits: Any) -> dict[str, Any]:
    """``limits`` added to a string schema, or to the string option of an ``anyOf``; a
    pattern the schema has already (``^tool-.+$``) is kept, the new one added beside it."""
    if schema.get("type") == "string":
        if "pattern" in schema and "pattern" in limits:
            also = {"pattern": limits.pop("pattern")}
            return {**schema, **limits, "allOf": [*schema.get("allOf", []), also]}
        return {**schema, **limits}
    if "anyOf" in schema:
        return {**schema, "anyOf": [_string_limits(option, **limits) for option in schema["anyOf"]]}
    return schema


def _openapi_path(rule: Rule) -> str:
    return re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", rule.rule)


def _operation(note: Operation, rule: Rule, scope: str, schemas: _Schemas) -> dict[str, Any]:
    found: dict[str, Any] = {
        "summary": note.summary,
        "operationId": rule.endpoint.replace(".", "_"),
        "tags": [note.tag],
        "parameters": _parameters(note, rule, schemas),
        "responses": _responses(note, scope, schemas),
        "security": _security(scope),
        "x-think-jobs-scope": scope,
    }
    if note.description:
        found["description"] = note.description
    if note.body is not None:
        required = any(f.is_required() for f in note.body.model_fields.values())
        content = {"application/json": {"schema": schemas.ref(note.body)}}
        found["requestBody"] = {"required": required, "content": content}
    return found


def _security_schemes() -> dict[str, Any]:
    name, description = _SIGNATURES[current_extension().jobs.settings.webhook_scheme]
    signature = {"type": "apiKey", "in": "header", "name": name, "description": description}
    return {"bearerAuth": _BEARER, "webhookSignature": signature}


def header_schema(name: str) -> dict[str, Any]:
    """The schema of a request header's value, as the server checks it."""
    return dict(_HEADER_SCHEMAS.get(name.lower(), _KEY_HEADER))


def _security(scope: str) -> list[dict[str, list[str]]]:
    if scope in (auth.READ, auth.WRITE):
        return [{"bearerAuth": []}]
    if scope == auth.SIGNED:
        return [{"webhookSignature": []}]
    return []


def _parameters(note: Operation, rule: Rule, schemas: _Schemas) -> list[dict[str, Any]]:
    found = [_path_parameter(name) for name in sorted(rule.arguments)]
    for name, description in note.all_headers().items():
        schema = header_schema(name)
        found.append({"name": name, "in": "header", "description": description, "schema": schema})
    if note.query is not None:
        properties, required = schemas.properties(note.query)
        for name, schema in properties.items():
            found.append(_query_parameter(name, schema, name in required))
    return found


def _path_parameter(name: str) -> dict[str, Any]:
    if name == "agent_type":
        schema: dict[str, Any] = {"type": "string", "enum": current_extension().jobs.agent_types}
    else:
        schema = TypeAdapter(_PATH_PARAMS.get(name, str)).json_schema()
    return {"name": name, "in": "path", "required": True, "schema": schema}


def _query_parameter(name: str, schema: dict[str, Any], required: bool) -> dict[str, Any]:
    options = [s for s in schema.get("anyOf", [schema]) if s.get("type") != "null"]
    plain = {k: v for k, v in schema.items() if k not in ("anyOf", "default", "title")}
    parameter: dict[str, Any] = {
        "name": name,
        "in": "query",
        "required": required,
        "schema": {**plain, **options[0]},
    }
    if options[0].get("type") == "array":
        parameter.update(style="form", explode=True)
    return parameter


def _responses(note: Operation, scope: str, schemas: _Schemas) -> dict[str, Any]:
    error = {"application/json": {"schema": schemas.ref(ErrorBody)}}
    found: dict[str, Any] = {}
    for status, reply in sorted(note.responses.items()):
        found[str(status)] = _reply(status, reply, schemas)
    statuses = _ERRORS_BY_SCOPE[scope] + ((413, 415) if note.body is not None else ())
    for status in statuses:
        found.setdefault(str(status), {"description": _ERRORS[status], "content": error})
    return found


def _reply(status: int, reply: Reply, schemas: _Schemas) -> dict[str, Any]:
    if reply is None:
        return {"description": "No content" if status == 204 else "Done"}
    if isinstance(reply, str):
        return {"description": "Server-Sent Events", "content": {reply: {"schema": {}}}}
    return {
        "description": (reply.__doc__ or reply.__name__).strip().splitlines()[0],
        "content": {"application/json": {"schema": schemas.ref(reply)}},
    }
