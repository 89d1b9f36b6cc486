"""Prometheus metrics. Labels are low-cardinality only: agent type, status, outcome, kind —
never agent names, submission ids or request ids.

Counters and histograms live in ``prometheus_client``'s default registry (multiprocess-safe when
``PROMETHEUS_MULTIPROC_DIR`` is set, e.g. under gunicorn or the prefork pool). Queue depth comes
from the database at scrape time (``QueueCollector``), so every process reports the same truth.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

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
from sqlalchemy import func, select

from think_jobs.db.tables import agents, turns

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from think_jobs.runtime import ThinkJobs

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
FENCED_WRITES = Counter(
    "think_jobs_fenced_writes",
    "Writes refused because the attempt making them had lost its turn to a newer one.",
    ["kind"],
)


class QueueCollector(Collector):
    """Pending and running turns per agent type, read from the database at scrape time."""

    def __init__(self, jobs: ThinkJobs) -> None:
        self._jobs = jobs

    def collect(self) -> Iterator[Metric]:
        pending = GaugeMetricFamily(
            "think_jobs_pending_turns",
            "Turns waiting in their agent's queue.",
            labels=["agent_type"],
        )
        running = GaugeMetricFamily(
            "think_jobs_running_turns", "Turns running now.", labels=["agent_type"]
        )
        counts = {(agent_type, status): n for agent_type, status, n in self._counts()}
        known = sorted({agent_type for agent_type, _ in counts} | set(self._jobs.agent_types))
        for agent_type in known:  # 0, not a missing sample, when nothing waits or runs
            pending.add_metric([agent_type], counts.get((agent_type, "pending"), 0))
            running.add_metric([agent_type], counts.get((agent_type, "running"), 0))
        yield pending
        yield running

    def _counts(self) -> list[tuple[str, str, int]]:
        query = (
            select(agents.c.agent_type, turns.c.status, func.count())
            .join(agents, agents.c.id == turns.c.agent_id)
            .where(turns.c.status.in_(("pending", "running")))
            .group_by(agents.c.agent_type, turns.c.status)
        )
        with self._jobs.db.read() as conn:
            return [(row[0], row[1], int(row[2])) for row in conn.execute(query)]


def process_registry() -> CollectorRegistry:
    """This process's metrics, or every process's when PROMETHEUS_MULTIPROC_DIR is set."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return registry


def exposition(jobs: ThinkJobs) -> bytes:
    """The Prometheus text format of this process's metrics plus the queue gauges."""
    queue_registry = CollectorRegistry()
    queue_registry.register(QueueCollector(jobs))
    return generate_latest(process_registry()) + generate_latest(queue_registry)


def start_metrics_server(jobs: ThinkJobs, port: int, host: str = "0.0.0.0") -> None:
    """Serve ``exposition(jobs)`` at ``http://host:port/metrics`` from a daemon thread."""
    from prometheus_client import start_http_server

    registry = CollectorRegistry()
    registry.register(_Combined(jobs))
    start_http_server(port, addr=host, registry=registry)


class _Combined(Collector):
    def __init__(self, jobs: ThinkJobs) -> None:
        self._queue = QueueCollector(jobs)

    def collect(self) -> Iterator[Metric]:
        yield from process_registry().collect()
        yield from self._queue.collect()
