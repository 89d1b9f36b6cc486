"""How a worker's presence record describes what it runs (``think-jobs workers``, the
dashboard): timed by the worker's own clock, whatever the reader's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from think_jobs.results import RunningTask, WorkerRecord


def record(seen_at: datetime, *tasks: RunningTask) -> WorkerRecord:
    return WorkerRecord(
        name="w@host",
        role="worker",
        hostname="host",
        pid=1,
        queues=["q"],
        agent_types=["Lead"],
        concurrency=2,
        running=list(tasks),
        started_at=seen_at - timedelta(hours=1),
        seen_at=seen_at,
    )


def test_running_tasks_are_timed_by_the_workers_clock_not_the_readers() -> None:
    """A worker whose clock is an hour ahead of the reader's: its task has run 3 s by its own
    clock (the reader's would say it starts in an hour, shown as 0 s)."""
    ahead = datetime.now(UTC) + timedelta(hours=1)
    drain = RunningTask(
        task="think_jobs.drain", agent="Lead:weekly", since=ahead - timedelta(seconds=3)
    )
    fire = RunningTask(task="think_jobs.fire", agent=None, since=ahead - timedelta(seconds=65))
    assert record(ahead, drain, fire).running_described() == [
        "drain Lead:weekly (3 s)",
        "fire (65 s)",
    ]
