"""Server tools: a name, a description, a JSON schema for the input, a function, and whether a
call needs a human's approval before it runs (``needs_approval``: always, or decided per input)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, overload

from pydantic import ConfigDict, TypeAdapter, create_model

ApprovalRule = bool | Callable[[Mapping[str, Any]], bool]


@dataclass(frozen=True)
class Tool:
    """A tool the model may call. ``execute(input)`` returns a JSON-ready output or raises.

    ``needs_approval``: ``True`` (every call waits for ``respond_to_approval``), or a function
    of the call's input that says whether this call must wait.
    """

    description: str
    input_schema: Mapping[str, Any]
    execute: Callable[[Mapping[str, Any]], Any]
    name: str = ""
    needs_approval: ApprovalRule = False

    def approval_needed(self, raw_input: Any) -> bool:
        """Whether a call with ``raw_input`` must wait for a human's approval."""
        rule = self.needs_approval
        if callable(rule):
            return bool(rule(raw_input if isinstance(raw_input, Mapping) else {}))
        return bool(rule)


def _input_model(fn: Callable[..., Any]) -> type[Any]:
    fields: dict[str, Any] = {}
    hints = inspect.get_annotations(fn, eval_str=True)
    for name, param in inspect.signature(fn).parameters.items():
        annotation = hints.get(name, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[name] = (annotation, default)
    return create_model(  # type: ignore[no-any-return]
        f"{fn.__name__}_input", __config__=ConfigDict(extra="forbid"), **fields
    )


def _tool_from_function(
    fn: Callable[..., Any],
    name: str | None,
    description: str | None,
    needs_approval: ApprovalRule = False,
) -> Tool:
    model = _input_model(fn)
    adapter: TypeAdapter[Any] = TypeAdapter(model)
    schema = adapter.json_schema()
    schema.pop("title", None)

    def execute(raw: Mapping[str, Any]) -> Any:
        validated = adapter.validate_python(dict(raw))
        return fn(**{key: getattr(validated, key) for key in model.model_fields})

    doc = description if description is not None else inspect.getdoc(fn) or ""
    return Tool(
        description=doc,
        input_schema=schema,
        execute=execute,
        name=name or fn.__name__,
        needs_approval=needs_approval,
    )


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    needs_approval: ApprovalRule = False,
) -> Callable[[Callable[..., Any]], Tool]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    needs_approval: ApprovalRule = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Build a ``Tool`` from a typed function; its docstring is the description.

    ``@tool`` or ``@tool(name=..., description=..., needs_approval=...)``. Arguments are
    validated with pydantic before the function runs; a validation error becomes a
    ``tool-output-error``. ``needs_approval`` (``True``, or a function of the input) makes a
    call end the turn with the tool part in ``approval-requested`` until someone answers
    ``respond_to_approval``.
    """
    if fn is not None:
        return _tool_from_function(fn, name, description)
    return lambda f: _tool_from_function(f, name, description, needs_approval)
