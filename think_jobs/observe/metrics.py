"""Prometheus metrics. Labels are low-cardinality only: agent type, status, outcome, kind —
never agent names, submission ids or request ids.

Counters and histograms live in ``prometheus_client``'s default registry (multiprocess-safe when
``PROMETHEUS_MULTIPROC_DIR`` is set, e.g. under gunicorn or the prefork pool). Queue depth comes
from the database at scrape time (``QueueCollector``, through a ``DepthSource`` the runtime
provides), so every process reports the same truth.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Protocol

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric


_LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)

SUBMISSIONS = Counter(
    "think_jobs_submissions",
    "Durable submissions received, by outcome (accepted or duplicate).",
    ["agent_type", "outcome"],
)
TURNS_FINISHED = Counter(
    "think_jobs_turns_finished", "Turns that reached a final status.", ["agent_type", "status"]
)
TURN_DURATION = Histogram(
    "think_jobs_turn_duration_seconds",
    "Turn start to final status.",
    ["agent_type"],
    buckets=_LATENCY_BUCKETS_S,
)
FIRST_CHUNK = Histogram(
    "think_jobs_time_to_first_chunk_seconds",
    "Attempt start to the first content chunk of the model.",
    ["agent_type"],
    buckets=_LATENCY_BUCKETS_S,
)
QUEUE_WAIT = Histogram(
    "think_jobs_queue_wait_seconds",
    "Admission to turn start (time spent waiting in the agent's queue).",
    ["agent_type"],
    buckets=_LATENCY_BUCKETS_S,
)
RECOVERIES = Counter(
    "think_jobs_recoveries",
    "Turns picked up after their executor died or stalled, by kind.",
    ["agent_type", "kind"],
)
SCHEDULED_FIRES = Counter(
    "think_jobs_scheduled_fires", "Scheduled task occurrences fired.", ["agent_type", "kind"]
)
CHUNKS_PUBLISHED = Counter(
    "think_jobs_chunks_published", "Stream chunks published to Redis.", ["agent_type"]
)
STREAMS_INCOMPLETE = Counter(
    "think_jobs_streams_incomplete",
    "Turn streams left without their end because Redis could not be reached in time "
    "(readers rebuild them from the database).",
)
STREAM_CONNECTION_WAITS = Counter(
    "think_jobs_stream_connection_waits",
    "Turns that found every stream connection of their process held and wrote their stream "
    "through the shared ones, a command at a time (raise redis_stream_connections).",
)
FENCED_WRITES = Counter(
    "think_jobs_fenced_writes",
    "Writes refused because the attempt making them had lost its turn to a newer one.",
    ["kind"],
)


class DepthSource(Protocol):
    """Where the queue gauges come from (``ThinkJobs`` is one)."""

    def queue_depths(self) -> Mapping[str, tuple[int, int]]:
        """Per agent type: (pending, running) turns, 0 for a registered type with none."""
        ...

    def overdue_fires(self) -> Mapping[str, int]:
        """Per agent type: scheduled occurrences claimed, not fired, past their re-send
        time; 0 for a registered type with none."""
        ...


class QueueCollector(Collector):
    """Pending and running turns, and overdue scheduled fires, per agent type, read from the
    database at scrape time."""

    def __init__(self, source: DepthSource) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        pending = GaugeMetricFamily(
            "think_jobs_pending_turns",
            "Turns waiting in their agent's queue.",
            labels=["agent_type"],
        )
        running = GaugeMetricFamily(
            "think_jobs_running_turns", "Turns running now.", labels=["agent_type"]
        )
        for agent_type, (waiting, busy) in sorted(self._source.queue_depths().items()):
            pending.add_metric([agent_type], waiting)  # 0, not a missing sample
            running.add_metric([agent_type], busy)
        yield pending
        yield running
        overdue = GaugeMetricFamily(
            "think_jobs_overdue_fires",
            "Scheduled occurrences claimed and not fired past their re-send time.",
            labels=["agent_type"],
        )
        for agent_type, count in sorted(self._source.overdue_fires().items()):
            overdue.add_metric([agent_type], count)
        yield overdue


def process_registry() -> CollectorRegistry:
    """This process's metrics, or every process's when PROMETHEUS_MULTIPROC_DIR is set."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return registry


def exposition(source: DepthSource) -> bytes:
    """The Prometheus text format of this process's metrics plus the queue gauges."""
    queue_registry = CollectorRegistry()
    queue_registry.register(QueueCollector(source))
    return generate_latest(process_registry()) + generate_latest(queue_registry)


def start_metrics_server(source: DepthSource, port: int, host: str = "0.0.0.0") -> None:
    """Serve ``exposition(source)`` at ``http://host:port/metrics`` from a daemon thread."""
    from prometheus_client import start_http_server

    registry = CollectorRegistry()
    registry.register(_Combined(source))
    start_http_server(port, addr=host, registry=registry)


class _Combined(Collector):
    def __init__(self, source: DepthSource) -> None:
        self._queue = QueueCollector(source)

    def collect(self) -> Iterator[Metric]:
        yield from process_registry().collect()
        yield from self._queue.collect()
