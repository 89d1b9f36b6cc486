"""Reading what a request names: the agent in the URL, a JSON body, a query, as typed values."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from flask import Response, request
from pydantic import BaseModel, TypeAdapter, ValidationError

from think_jobs import Think
from web.current import current_extension
from web.errors import ApiError, from_validation
from web.schemas import AgentName, Identifier, Key

Model = TypeVar("Model", bound=BaseModel)
_NAME = TypeAdapter(AgentName)
_ID = TypeAdapter(Identifier)
_KEY = TypeAdapter(Key)
_LIST_FIELDS = ("status",)


def agent(agent_type: str, agent_name: str) -> Think:
    """The agent a URL names: 404 for an unregistered type, 400 for an unusable name."""
    try:
        name = _NAME.validate_python(agent_name)
    except ValidationError as error:
        raise from_validation(error, where="path.agent_name") from None
    return current_extension().agent(agent_type, name)


def identifier(value: str, where: str) -> str:
    """A submission id, request id or key: printable ASCII without ``/``, not ``.`` or
    ``..``, at most 255 characters (the core's rule); 400 naming ``where`` otherwise."""
    try:
        return _ID.validate_python(value)
    except ValidationError as error:
        raise from_validation(error, where=where) from None


def key(value: str, where: str) -> str:
    """An idempotency key or delivery id (a header): the id rule without spaces."""
    try:
        return _KEY.validate_python(value)
    except ValidationError as error:
        raise from_validation(error, where=where) from None


def json_body(model: type[Model], *, optional: bool = False) -> Model:
    """The request body as ``model``: 415 when it is not JSON, 400 when it does not fit.

    ``optional``: no body at all (zero bytes) means ``model()``; anything else, whitespace
    included, must be a JSON document.
    """
    raw = request.get_data(cache=True)
    if not raw and optional:
        return model()
    if request.mimetype != "application/json":
        raise ApiError(415, "send the body as JSON (Content-Type: application/json)")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as error:
        message = f"request body is not valid JSON: {error}"
        raise ApiError(400, message, type="invalid_json") from None
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise from_validation(error) from None


def query(model: type[Model]) -> Model:
    """The query string as ``model``; list fields may repeat or be comma-separated."""
    data: dict[str, Any] = {}
    for key in request.args:
        values = request.args.getlist(key)
        if key in _LIST_FIELDS:
            # An empty part (``status=``) is a mistake, not "no filter": it fails validation.
            data[key] = [part for value in values for part in value.split(",")]
        else:
            data[key] = values[-1]
    known = {key: value for key, value in data.items() if key in model.model_fields}
    try:
        return model.model_validate(known)
    except ValidationError as error:
        raise from_validation(error, where="query") from None


def model_response(model: BaseModel, status: int = 200) -> Response:
    """A pydantic model as a JSON response (aliases as the model defines them)."""
    return Response(model.model_dump_json(), status=status, mimetype="application/json")
