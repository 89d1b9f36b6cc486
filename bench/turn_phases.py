"""Where a lone turn's time goes: the phases of ``turn_overhead``'s turn, one after another.

An in-process worker (``think_jobs.testing.worker``, threads pool, concurrency 2) runs
one-chunk turns of warm agents, one at a time; the engine functions that end each phase are
wrapped to note the time they return (the submit in the caller, then in the worker: Celery's
delivery up to the drain's start, the claim, the attempt's set-up, the model and its stream,
the final write, the stream's end and the hooks, the release). The caller's answer comes with
the hook (as in ``turn_overhead``); the release follows it. Prints the p50 and mean of each
phase. A diagnosis, not a comparison: the caller and the worker share one interpreter here,
so the figures run a little higher than across processes.

    .venv/bin/python -m bench.turn_phases [--quick] [--backends postgres,sqlite] [--turns 300]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bench.agents import OneChunk, done_key
from bench.services import scratch
from think_jobs import ThinkJobs
from think_jobs.engine import attempt, drain, execution, lease
from think_jobs.testing import worker

# (phase, the object whose function ends it, the function's name)
_ENDS: list[tuple[str, Any, str]] = [
    ("the claim (with the drain's start)", execution, "claim"),
    ("the model and its stream", attempt.Attempt, "run"),
    ("the final write", execution._Run, "_write_final"),
    ("the stream's end and the hooks", attempt.Attempt, "deliver"),
    ("the release (after the answer)", lease.Lease, "release"),
]
_STARTS = ("Celery's delivery", drain, "drain")  # its start ends the delivery


class Marks:
    """The time each wrapped function returned (or, for the drain, began), per turn."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}

    def note(self, name: str) -> None:
        self.at.setdefault(name, time.perf_counter())


@contextmanager
def wrapped(marks: Marks) -> Iterator[None]:
    """Wrap the phase-ending functions for the block's duration."""
    originals: list[tuple[Any, str, Callable[..., Any]]] = []

    def wrap(owner: Any, attribute: str, name: str, *, at_start: bool) -> None:
        original = getattr(owner, attribute)
        originals.append((owner, attribute, original))

        def timed(*args: Any, **kwargs: Any) -> Any:
            if at_start:
                marks.note(name)
            try:
                return original(*args, **kwargs)
            finally:
                if not at_start:
                    marks.note(name)

        setattr(owner, attribute, timed)

    wrap(_STARTS[1], _STARTS[2], _STARTS[0], at_start=True)
    for name, owner, attribute in _ENDS:
        wrap(owner, attribute, name, at_start=False)
    try:
        yield
    finally:
        for owner, attribute, original in originals:
            setattr(owner, attribute, original)


def _turn(jobs: ThinkJobs, agent: OneChunk, marks: Marks) -> dict[str, float] | None:
    marks.at.clear()
    started = time.perf_counter()
    text = "Where is my parcel?"
    message = {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": text}]}
    result = agent.submit_messages([message])
    submitted = time.perf_counter()
    if jobs.redis.blpop([done_key(jobs, result.submission_id)], timeout=30) is None:
        raise TimeoutError(f"{result.submission_id} did not finish in 30 s")
    answered = time.perf_counter()
    deadline = answered + 10
    last = _ENDS[-1][0]
    while last not in marks.at and time.perf_counter() < deadline:
        time.sleep(0.0005)  # the release follows the answer
    return _phases(marks.at, started, submitted, answered)


def _phases(
    at: dict[str, float], started: float, submitted: float, answered: float
) -> dict[str, float] | None:
    names = [_STARTS[0], *(name for name, _, _ in _ENDS)]
    if any(name not in at for name in names):
        return None  # a turn another path ran (a duplicate drain, say): not this shape
    phases = {"the submit (caller)": submitted - started}
    previous = submitted
    for name in names:
        phases[name] = at[name] - previous
        previous = at[name]
    phases["submit → answer"] = answered - started
    return phases


def measure_backend(backend: str, *, turns: int, warmup: int) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {}
    marks = Marks()
    with scratch(backend) as run, wrapped(marks):
        jobs = run.jobs
        agents = [jobs.get_agent(OneChunk, f"phase-{i}") for i in range(20)]
        for agent in agents:
            agent.start()
        with worker(jobs, concurrency=2):
            for index in range(warmup + turns):
                phases = _turn(jobs, agents[index % len(agents)], marks)
                if index >= warmup and phases is not None:
                    for name, seconds in phases.items():
                        found.setdefault(name, []).append(seconds)
    return found


def table(backend: str, found: dict[str, list[float]]) -> str:
    lines = [f"\n{backend}: {len(next(iter(found.values()), []))} turns\n"]
    lines += ["| phase | p50 (ms) | mean (ms) |", "|---|---:|---:|"]
    for name, values in found.items():
        p50, mean = statistics.median(values) * 1e3, statistics.fmean(values) * 1e3
        lines.append(f"| {name} | {p50:.2f} | {mean:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--backends", default="postgres,sqlite")
    parser.add_argument("--turns", type=int, default=300)
    args = parser.parse_args()
    turns, warmup = (20, 5) if args.quick else (args.turns, 50)
    for backend in args.backends.split(","):
        print(table(backend, measure_backend(backend, turns=turns, warmup=warmup)), flush=True)


if __name__ == "__main__":
    main()
