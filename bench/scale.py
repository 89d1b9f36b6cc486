"""Scale: ``list_submissions`` and the claim of the next pending turn with 10 k and 1 M rows.

Each dataset is bulk-inserted with SQL: many agents (about ``--per-agent`` turns each, their
rows interleaved in time as real traffic would leave them), 2 % errors, a few pending; the
measured agent has the same ``--history`` turns in both datasets (mostly completed, 2 % errors,
3 pending at the end). Only the table size differs, so the ratio shows what the table size
costs. The claim runs ``claim_next`` in a write transaction that is rolled back, so every
sample claims the same head turn; admission is measured the same way.

    .venv/bin/python -m bench.scale [--quick] [--backends postgres,sqlite] [--explain]
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from bench import measure, report
from bench.agents import OneChunk
from bench.datasets import Shape, explain_plans, fill
from bench.measure import Latency
from bench.report import Figure, Target
from bench.services import Scratch, scratch
from think_jobs.db import agents as agent_ops
from think_jobs.domain.records import AgentRef, Claim, NewTurn
from think_jobs.domain.status import Kind
from think_jobs.engine import queueing

TARGET = Target("<=", 1.2)  # issue 19: list and claim stay flat from 10 k to 1 M rows
MEASURED = "measured"
USER_MESSAGE = {"id": "m-bench", "role": "user", "parts": [{"type": "text", "text": "Hello"}]}


class _Rollback(Exception):
    """Raised to leave a write transaction without committing."""


@contextmanager
def rolled_back(run: Scratch) -> Iterator[Any]:
    try:
        with run.jobs.db.write() as conn:
            yield conn
            raise _Rollback
    except _Rollback:
        pass


class Operations:
    """The timed operations on one dataset."""

    def __init__(self, run: Scratch, agent_id: int) -> None:
        self.run = run
        self.agent = run.jobs.get_agent(OneChunk, MEASURED)
        self.agent_id = agent_id
        self.cursor = self.agent.list_submissions(limit=100)[-1].submission_id

    def list_newest(self, _: int) -> None:
        assert len(self.agent.list_submissions(limit=50)) == 50

    def list_older(self, _: int) -> None:
        assert len(self.agent.list_submissions(limit=50, before=self.cursor)) == 50

    def list_pending(self, _: int) -> None:
        assert len(self.agent.list_submissions(status="pending")) == 3

    def list_active(self, _: int) -> None:
        assert len(self.agent.list_submissions(status=["pending", "running"])) == 3

    def list_terminal(self, _: int) -> None:
        self.agent.list_submissions(status=["completed", "error"], limit=50)

    def claim(self, _: int) -> None:
        with rolled_back(self.run) as conn:
            agent = AgentRef(self.agent_id, self.agent.agent_type, self.agent.name)
            claim = queueing.claim_next(conn, agent, lease_ttl_s=30.0, max_recoveries=10)
            assert isinstance(claim, Claim), claim

    def admit(self, index: int) -> None:
        with rolled_back(self.run) as conn:
            new = NewTurn(
                str(uuid.uuid4()),
                Kind.SUBMISSION,
                "submission",
                messages=[USER_MESSAGE],
                idempotency_key=f"bench-{index}",
            )
            queueing.admit_submission(conn, self.agent_id, new, submission_id=None)

    def sweep_query(self, _: int) -> None:
        with self.run.jobs.db.read() as conn:
            agent_ops.agents_needing_a_drain(conn, limit=1000)


OPERATIONS: dict[str, str] = {
    "list_submissions() p50 (ms)": "list_newest",
    "list_submissions(before=cursor) p50 (ms)": "list_older",
    "list_submissions(status=pending) p50 (ms)": "list_pending",
    "list_submissions(status=[pending, running]) p50 (ms)": "list_active",
    "list_submissions(status=[completed, error]) p50 (ms)": "list_terminal",
    "claim_next (rolled back) p50 (ms)": "claim",
    "admit_submission (rolled back) p50 (ms)": "admit",
    "sweeper query p50 (ms)": "sweep_query",
}
HEADLINE = {
    "list_submissions() p50 (ms)",
    "list_submissions(status=pending) p50 (ms)",
    "list_submissions(status=[pending, running]) p50 (ms)",
    "claim_next (rolled back) p50 (ms)",
    "sweeper query p50 (ms)",
}


def build(stack: ExitStack, backend: str, rows: int, args: argparse.Namespace) -> Operations:
    run = stack.enter_context(scratch(backend))
    started = time.perf_counter()
    shape = Shape(rows=rows, history=args.history, per_agent=args.per_agent)
    agent_id = fill(run, shape, agent_type=OneChunk.agent_type, measured=MEASURED)
    print(f"{backend}: {rows:,} rows in {time.perf_counter() - started:.1f} s", flush=True)
    return Operations(run, agent_id)


def measure_all(datasets: list[Operations], *, count: int, rounds: int) -> list[dict[str, Latency]]:
    found: list[dict[str, Latency]] = [{name: Latency(()) for name in OPERATIONS} for _ in datasets]
    for ops in datasets:  # warm-up
        for method in OPERATIONS.values():
            measure.sample(getattr(ops, method), count=20)
    for _ in range(rounds):
        for ops, series in zip(datasets, found, strict=True):
            for name, method in OPERATIONS.items():
                series[name] += measure.sample(getattr(ops, method), count=count // rounds)
    return found


def figures_of(
    backend: str, small: int, large: int, found: list[dict[str, Latency]]
) -> list[Figure]:
    case = f"{backend}, {large:,} vs {small:,} rows"
    figures = []
    for name in OPERATIONS:
        target = TARGET if name in HEADLINE else None
        big, little = found[1][name], found[0][name]
        figures.append(Figure("scale", case, name, big.p50, little.p50, f"{small:,} rows", target))
    return figures


def run_backend(backend: str, args: argparse.Namespace) -> list[Figure]:
    with ExitStack() as stack:
        datasets = [build(stack, backend, rows, args) for rows in (args.small, args.large)]
        found = measure_all(datasets, count=args.count, rounds=args.rounds)
        if args.explain:
            explain_plans(datasets[1].run, datasets[1], methods=list(OPERATIONS.values()))
    return figures_of(backend, args.small, args.large, found)


def main(argv: list[str] | None = None) -> list[Figure]:
    parser = report.parser(__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=10_000, help="rows of the small dataset")
    parser.add_argument("--large", type=int, default=1_000_000, help="rows of the large one")
    parser.add_argument("--history", type=int, default=1000, help="the measured agent's turns")
    parser.add_argument("--per-agent", type=int, default=100, help="turns per other agent")
    parser.add_argument("--count", type=int, default=300, help="samples per operation")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--explain", action="store_true", help="print the hot queries' plans")
    args = parser.parse_args(argv)
    if args.quick:
        args.large, args.count, args.rounds = 100_000, 60, 1
    return report.run_backends(args, run_backend)


if __name__ == "__main__":
    main()
