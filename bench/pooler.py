"""Behind a pooler: what ``db_pooler="transaction"`` and a real PgBouncer in transaction mode
cost, against think-jobs straight to PostgreSQL in the same run.

Three ways to the same database, each with the same work (``--agents`` x ``--per-agent``
plain turns, accepted by 4 producer threads, then drained by 2 worker processes):

- **direct**: the default (prepared statements, the idle-in-transaction bound set once per
  session at connect);
- **pooler mode, direct**: ``db_pooler="transaction"`` straight to PostgreSQL — no prepared
  statements, the bound set by each write transaction — the setting's own cost;
- **through PgBouncer**: the same setting through a PgBouncer in transaction mode
  (``--server-sessions`` server sessions): the setting plus the pooler's hop.

The three run in turn within each round (the order rotating between rounds); figures are
medians over the rounds, ratios against *direct*. Per-agent order and exclusion are checked
after each drain (``bench.fifo_throughput``).

    .venv/bin/python -m bench.pooler [--quick] [--agents 40 --per-agent 25 --rounds 3]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from bench import measure, report
from bench.agents import OrderedPlain
from bench.fifo_throughput import Drain, clear_turns, drain, submit_all, violations
from bench.report import Figure, Target
from bench.services import Scratch, bench_jobs, scratch
from tests.support.pgbouncer import pgbouncer
from think_jobs import ThinkJobs

ZERO = Target("<=", 0, absolute=True)
MODES = ("direct", "pooler mode, direct", "through PgBouncer")


@dataclass(frozen=True)
class Phase:
    accepts_per_s: float
    turns: Drain
    violations: int


@contextmanager
def producer(env: dict[str, str]) -> Iterator[ThinkJobs]:
    """A ThinkJobs of ``env``'s settings with the bench agents registered."""
    jobs = bench_jobs(env)
    try:
        yield jobs
    finally:
        jobs.close()


def run_phase(run: Scratch, env: dict[str, str], args: argparse.Namespace) -> Phase:
    """Accept the work through ``env``'s settings, drain it with workers of the same."""
    count = args.agents * args.per_agent
    with producer(env) as jobs:
        started = time.perf_counter()
        admitted = submit_all(
            jobs, agents=args.agents, per_agent=args.per_agent, agent_class=OrderedPlain
        )
        accepts_per_s = count / (time.perf_counter() - started)
    extra = {k: v for k, v in env.items() if run.env.get(k) != v}
    turns = drain(
        run,
        expected=count,
        concurrency=args.concurrency,
        timeout_s=120 + count / 5,
        plain=True,
        extra_env=extra,
    )
    found = violations(run.jobs, admitted)
    clear_turns(run.jobs, admitted)
    return Phase(accepts_per_s, turns, found)


def run_backend(backend: str, args: argparse.Namespace) -> list[Figure]:
    phases: dict[str, list[Phase]] = {mode: [] for mode in MODES}
    with (
        scratch(backend) as run,
        pgbouncer(run.database_url, server_sessions=args.server_sessions) as bouncer,
    ):
        pooled = {"THINK_JOBS_DB_POOLER": "transaction"}
        envs = {
            MODES[0]: run.env,
            MODES[1]: {**run.env, **pooled},
            MODES[2]: {
                **run.env,
                **pooled,
                "THINK_JOBS_DATABASE_URL": bouncer.url_of(run.database_url),
            },
        }
        for n in range(args.rounds):
            for mode in MODES[n % 3 :] + MODES[: n % 3]:
                phases[mode].append(run_phase(run, envs[mode], args))
    return figures_of(backend, args, phases)


def figures_of(
    backend: str, args: argparse.Namespace, phases: dict[str, list[Phase]]
) -> list[Figure]:
    def median(mode: str, value: str) -> float:
        return measure.median([_value(phase, value) for phase in phases[mode]])

    base = MODES[0]
    figures: list[Figure] = []
    for mode in MODES[1:]:
        case = (
            f"{backend}, {mode}, {args.agents} agents x {args.per_agent}, "
            f"2 workers x {args.concurrency}, {args.server_sessions} server sessions"
        )
        for value, unit in (
            ("accepts", "accepts/s"),
            ("turns", "turns/s"),
            ("cpu", "worker CPU per turn (ms)"),
        ):
            figures.append(
                Figure("pooler", case, unit, median(mode, value), median(base, value), base)
            )
        violations = sum(phase.violations for phase in phases[mode])
        figures.append(
            Figure("pooler", case, "order/exclusion violations", violations, target=ZERO)
        )
    return figures


def _value(phase: Phase, value: str) -> float:
    if value == "accepts":
        return phase.accepts_per_s
    return phase.turns.rate_per_s if value == "turns" else phase.turns.cpu_ms_per_unit


def main(argv: list[str] | None = None) -> list[Figure]:
    parser = report.parser(__doc__.splitlines()[0], backends="postgres")
    parser.add_argument("--agents", type=int, default=40)
    parser.add_argument("--per-agent", type=int, default=25)
    parser.add_argument("--concurrency", type=int, default=2, help="threads per worker")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three ways")
    parser.add_argument(
        "--server-sessions", type=int, default=20, help="PgBouncer's default_pool_size"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.agents, args.per_agent, args.rounds = 10, 5, 1
    return report.run_backends(args, run_backend)


if __name__ == "__main__":
    main()
