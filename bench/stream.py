"""Stream delivery: one turn of many chunks to a live ``agent.stream()`` subscriber, against
bare redis-py PUBLISH → SUBSCRIBE of the same payloads.

The turn runs on one ``think-jobs worker`` subprocess; the subscriber follows it from this
process, subscribed before the turn starts. The bare run publishes the very events the turn
stored in its replay buffer, one PUBLISH each, from a task on the same worker, to a plain
redis-py subscriber here. Rates count events from the first received to the last. Events per
append call divide the turn's events by the EVALSHA calls the Redis server counted meanwhile
(``INFO commandstats``: server-wide, so anything else using the server adds to it).

    .venv/bin/python -m bench.stream [--quick] [--chunks 10000]
"""

from __future__ import annotations

import argparse
import time
import uuid
from dataclasses import dataclass, replace

from bench import measure, report
from bench.agents import PUBLISH_TASK, LongStream
from bench.report import Figure, Target
from bench.services import Scratch, WorkerProcess, scratch, worker_processes
from think_jobs.transport.streams import open_pubsub

TARGET = Target(">=", 0.5)
CPU_TARGET = Target("<=", 1.0)  # issue 19: worker CPU per event at most a bare PUBLISH's
_TIMEOUT_S = 300


@dataclass(frozen=True)
class Delivery:
    events: int
    first_s: float
    last_s: float
    worker_cpu_s: float = 0.0
    script_calls: int = 0

    @property
    def rate_per_s(self) -> float:
        return (self.events - 1) / (self.last_s - self.first_s)

    @property
    def cpu_us_per_event(self) -> float:
        return self.worker_cpu_s * 1e6 / self.events

    @property
    def events_per_call(self) -> float:
        return self.events / max(1, self.script_calls)

    def with_cpu(self, worker_cpu_s: float, script_calls: int = 0) -> Delivery:
        return replace(self, worker_cpu_s=worker_cpu_s, script_calls=script_calls)


def script_calls(run: Scratch) -> int:
    """EVALSHA calls the Redis server has run so far (every client's)."""
    stats = run.jobs.redis.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0))


def _submit(run: Scratch, request_id: str, chunks: int) -> LongStream:
    """Submit one long turn (the subscriber that follows it replays what it missed)."""
    agent = run.jobs.get_agent(LongStream, f"stream-{request_id[:8]}")
    text = {"type": "text", "text": str(chunks)}
    message = {"id": uuid.uuid4().hex, "role": "user", "parts": [text]}
    agent.submit_messages([message], submission_id=request_id)
    return agent


def think_jobs_delivery(run: Scratch, chunks: int) -> tuple[Delivery, str]:
    """Follow one long turn; returns the delivery and the Redis key of its stream buffer."""
    from think_jobs.engine.submissions import find_turn

    request_id = str(uuid.uuid4())
    agent = _submit(run, request_id, chunks)
    first = last = 0.0
    events = 0
    for event in agent.stream(request_id, timeout_s=_TIMEOUT_S):
        last = time.perf_counter()
        first = first or last
        events += 1
        if event.done:
            break
    turn = find_turn(run.jobs.services, agent, request_id)
    assert turn is not None
    return Delivery(events, first, last), run.jobs.keys.stream_buffer(agent.address, turn.id)


def bare_delivery(run: Scratch, source_key: str, expected: int) -> Delivery:
    """The same payloads, PUBLISHed one by one from the worker, read by a plain subscriber."""
    jobs = run.jobs
    channel = f"{jobs.keys.prefix}:bench:bare-channel"
    pubsub = open_pubsub(jobs.redis)
    pubsub.subscribe(channel)
    try:
        jobs.celery.tasks[PUBLISH_TASK].apply_async(args=[channel, source_key])
        first = last = 0.0
        deadline = time.monotonic() + _TIMEOUT_S
        events = 0
        while events < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"bare stream stopped after {events} of {expected} messages")
            if pubsub.get_message(timeout=1.0) is None:  # a timeout, or a confirmation
                continue
            last = time.perf_counter()
            first = first or last
            events += 1
    finally:
        pubsub.close()
    return Delivery(expected, first, last)


def run_round(run: Scratch, worker: WorkerProcess, chunks: int) -> tuple[Delivery, Delivery]:
    """One think-jobs turn, then the bare replay of its events; each with the worker's CPU."""
    cpu, calls = worker.cpu_s(), script_calls(run)
    turn, buffer = think_jobs_delivery(run, chunks)
    turn = turn.with_cpu(worker.cpu_s() - cpu, script_calls(run) - calls)
    cpu = worker.cpu_s()
    stored = int(run.jobs.redis.llen(buffer))
    if stored != turn.events:
        raise RuntimeError(f"subscriber saw {turn.events} events, the buffer holds {stored}")
    bare = bare_delivery(run, buffer, stored)
    return turn, bare.with_cpu(worker.cpu_s() - cpu)


def run_backend(backend: str, args: argparse.Namespace) -> list[Figure]:
    with scratch(backend) as run, worker_processes(run, count=1, concurrency=2) as workers:
        run_round(run, workers[0], min(args.chunks, 500))  # warm-up
        results = [run_round(run, workers[0], args.chunks) for _ in range(args.rounds)]
    turn = measure.median([t.rate_per_s for t, _ in results])
    bare = measure.median([b.rate_per_s for _, b in results])
    turn_cpu = measure.median([t.cpu_us_per_event for t, _ in results])
    bare_cpu = measure.median([b.cpu_us_per_event for _, b in results])
    per_call = measure.median([t.events_per_call for t, _ in results])
    case = f"{backend}, {args.chunks:,} chunks, live subscriber"
    reference = "bare PUBLISH→SUBSCRIBE"
    return [
        Figure("stream", case, "events/s", turn, bare, reference, TARGET),
        Figure(
            "stream", case, "worker CPU per event (µs)", turn_cpu, bare_cpu, reference, CPU_TARGET
        ),
        Figure("stream", case, "events per append call", per_call),
    ]


def main(argv: list[str] | None = None) -> list[Figure]:
    parser = report.parser(__doc__.splitlines()[0], backends="postgres")
    parser.add_argument("--chunks", type=int, default=10_000, help="text chunks in the turn")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.quick:
        args.chunks, args.rounds = 1000, 1
    return report.run_backends(args, run_backend)


if __name__ == "__main__":
    main()
