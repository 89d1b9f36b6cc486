"""Issue 10: a trace of one submission links accept, queue wait, turn, model step and tool."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.apps.agents import Parent
from tests.support.builders import user, wait_for_status
from think_jobs import ThinkJobs
from think_jobs.testing import worker

EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(provider)
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def by_name(found: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in found if span.name == name]


def parent_id(span: ReadableSpan) -> int:
    """The span id of the span's parent (an AssertionError for a root span)."""
    assert span.parent is not None, span.name
    return span.parent.span_id


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_one_submission_is_one_trace(jobs: ThinkJobs, spans: InMemorySpanExporter) -> None:
    agent = jobs.get_agent(Parent, "traced")
    result = agent.submit_messages([user("delegate please")])
    with worker(jobs):
        wait_for_status(agent, result.submission_id, "completed")
    found = spans.get_finished_spans()
    accept = by_name(found, "think_jobs.accept")[0]
    trace_id = accept.context.trace_id
    parent_turn = next(
        s for s in by_name(found, "think_jobs.turn")
        if s.attributes and s.attributes["think_jobs.request_id"] == result.submission_id
    )  # fmt: skip
    assert parent_turn.context.trace_id == trace_id
    assert parent_turn.parent is not None and parent_turn.parent.span_id == accept.context.span_id
    wait = by_name(found, "think_jobs.queue_wait")
    assert any(
        s.context.trace_id == trace_id and parent_id(s) == accept.context.span_id for s in wait
    )
    steps = [
        s
        for s in by_name(found, "think_jobs.model_step")
        if parent_id(s) == parent_turn.context.span_id
    ]
    assert len(steps) == 2  # the tool call, then the answer
    tool = by_name(found, "think_jobs.tool")[0]
    assert tool.parent is not None and tool.parent.span_id == parent_turn.context.span_id
    child_turn = next(s for s in by_name(found, "think_jobs.turn") if s is not parent_turn)
    assert child_turn.context.trace_id == trace_id  # the child's chat() joins the same trace
    assert child_turn.parent is not None and child_turn.parent.span_id == tool.context.span_id
