"""Turn overhead: submit → completed for a one-chunk model against a bare Celery round trip.

Both run on the same worker: one ``think-jobs worker`` subprocess (threads pool, concurrency
2) consuming one queue. The bare round trip sends a task that pushes to a Redis list, and the
caller BLPOPs it. The target compares with the same round trip whose task first stores a
small result row and commits (``bare + write``, the reference issue 19 names). The think-jobs
turn pushes to a Redis list from ``on_chat_response`` (called inside the turn, after the final
status is committed and the ``done`` event published), and the caller BLPOPs it the same way.
A second think-jobs series observes completion the way a client would, by following
``agent.stream()`` to its ``done`` event. Turns rotate over a pool of warm agents, so a turn
never waits for the previous turn's lease release.

    .venv/bin/python -m bench.turn_overhead [--quick] [--backends postgres,sqlite]
"""

from __future__ import annotations

import argparse
import uuid
from typing import Any

from bench import measure, report
from bench.agents import PING_TASK, PING_WRITE_TASK, OneChunk, create_results_table, done_key
from bench.measure import Latency
from bench.report import Figure, Target
from bench.services import Scratch, scratch, worker_processes

TARGET = Target("<=", 1.5)
BARE = "bare Celery round trip"
BARE_WRITE = "bare round trip + result row"
_TIMEOUT_S = 30


def user_message() -> dict[str, Any]:
    text = "Where is my parcel?"
    return {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": text}]}


class TurnBench:
    def __init__(self, run: Scratch, *, agents: int) -> None:
        self.jobs = run.jobs
        self.agents = [self.jobs.get_agent(OneChunk, f"turn-{i}") for i in range(agents)]
        for agent in self.agents:
            agent.start()
        self.redis = self.jobs.redis
        self.ping = self.jobs.celery.tasks[PING_TASK]
        self.ping_write = self.jobs.celery.tasks[PING_WRITE_TASK]
        create_results_table(self.jobs)

    def _wait(self, request_id: str) -> None:
        if self.redis.blpop([done_key(self.jobs, request_id)], timeout=_TIMEOUT_S) is None:
            raise TimeoutError(f"{request_id} did not finish in {_TIMEOUT_S} s")

    def bare(self, index: int) -> None:
        request_id = uuid.uuid4().hex
        self.ping.apply_async(args=[request_id], queue=self.jobs.settings.queue)
        self._wait(request_id)

    def bare_write(self, index: int) -> None:
        request_id = uuid.uuid4().hex
        self.ping_write.apply_async(args=[request_id], queue=self.jobs.settings.queue)
        self._wait(request_id)

    def turn(self, index: int) -> None:
        agent = self.agents[index % len(self.agents)]
        self._wait(agent.submit_messages([user_message()]).submission_id)

    def streamed_turn(self, index: int) -> None:
        agent = self.agents[index % len(self.agents)]
        result = agent.submit_messages([user_message()])
        for event in agent.stream(result.submission_id, timeout_s=_TIMEOUT_S):
            if event.done:
                break
        self.redis.delete(done_key(self.jobs, result.submission_id))


SERIES = ("bare", "bare_write", "turn", "streamed_turn")


def measure_regime(
    bench: TurnBench, *, count: int, rounds: int, gap_s: float
) -> dict[str, Latency]:
    found = {name: Latency(()) for name in SERIES}
    per_round = max(1, count // rounds)
    for _ in range(rounds):
        for name in SERIES:
            found[name] += measure.sample(getattr(bench, name), count=per_round, gap_s=gap_s)
    return found


def figures_of(case: str, series: dict[str, Latency]) -> list[Figure]:
    bare, turn, streamed = series["bare"], series["turn"], series["streamed_turn"]
    written = series["bare_write"]
    return [
        Figure("turn overhead", case, "p50 (ms)", turn.p50, written.p50, BARE_WRITE, TARGET),
        Figure("turn overhead", case, "p99 (ms)", turn.p99, written.p99, BARE_WRITE),
        Figure("turn overhead", case, "p50 vs no write (ms)", turn.p50, bare.p50, BARE),
        Figure("turn overhead", case, "p50 via agent.stream (ms)", streamed.p50, bare.p50, BARE),
        Figure("turn overhead", case, "p99 via agent.stream (ms)", streamed.p99, bare.p99, BARE),
    ]


def run_backend(backend: str, args: argparse.Namespace) -> list[Figure]:
    figures: list[Figure] = []
    with scratch(backend) as run, worker_processes(run, count=1, concurrency=2):
        bench = TurnBench(run, agents=args.agents)
        measure_regime(bench, count=min(30, args.count), rounds=1, gap_s=0)  # warm-up
        for regime, gap_s in measure.regimes(gapped=not args.no_gaps):
            count = args.count if gap_s == 0 else args.gapped_count
            series = measure_regime(bench, count=count, rounds=args.rounds, gap_s=gap_s)
            figures += figures_of(f"{backend}, {regime}", series)
    return figures


def main(argv: list[str] | None = None) -> list[Figure]:
    parser = report.parser(__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=300, help="turns per series")
    parser.add_argument("--gapped-count", type=int, default=150, help="turns with idle gaps")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--agents", type=int, default=16, help="agents the turns rotate over")
    parser.add_argument("--no-gaps", action="store_true", help="skip the idle-gap regime")
    args = parser.parse_args(argv)
    if args.quick:
        args.count, args.gapped_count, args.rounds = 30, 15, 1
    return report.run_backends(args, run_backend)


if __name__ == "__main__":
    main()
