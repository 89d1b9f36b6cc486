"""OpenTelemetry spans (optional extra ``think-jobs[otel]``): one submission is one trace.

``think_jobs.accept`` is the root (or a child of the caller's span); its W3C context is stored
on the turn row, because the Celery message is only a per-agent nudge that may serve several
submissions. The executor continues the trace: ``think_jobs.queue_wait`` (admission → start),
``think_jobs.turn`` per attempt, ``think_jobs.model_step`` per model call and
``think_jobs.tool`` per tool call. Without the ``opentelemetry`` package, or without a
configured tracer provider, everything here is a cheap no-op.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
except ImportError:  # pragma: no cover - exercised when the extra is not installed
    trace = None  # type: ignore[assignment]

_TRACER_NAME = "think_jobs"


def enabled() -> bool:
    return trace is not None


@contextmanager
def span(
    name: str,
    *,
    attributes: Mapping[str, Any] | None = None,
    parent: Mapping[str, str] | None = None,
) -> Iterator[None]:
    """A span named ``name``; with ``parent`` (a stored carrier) it continues that trace."""
    if trace is None:
        yield
        return
    token = otel_context.attach(propagate.extract(dict(parent))) if parent else None
    try:
        tracer = trace.get_tracer(_TRACER_NAME)
        with tracer.start_as_current_span(name, attributes=_clean(attributes)):
            yield
    finally:
        if token is not None:
            otel_context.detach(token)


def record_span(
    name: str,
    *,
    start: datetime,
    end: datetime,
    parent: Mapping[str, str] | None,
    attributes: Mapping[str, Any] | None = None,
) -> None:
    """A span for an interval that already happened (the wait in the agent's queue)."""
    if trace is None or not parent:
        return
    tracer = trace.get_tracer(_TRACER_NAME)
    started = tracer.start_span(
        name,
        context=propagate.extract(dict(parent)),
        start_time=_nanos(start),
        attributes=_clean(attributes),
    )
    started.end(end_time=_nanos(end))


def carrier() -> dict[str, str] | None:
    """The current span's context as W3C headers (``traceparent``), or None."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers or None


def _nanos(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    return {key: value for key, value in (attributes or {}).items() if value is not None}
