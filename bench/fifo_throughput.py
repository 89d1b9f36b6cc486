"""FIFO throughput: many agents' queued turns drained by 2 worker processes, against the same
number of bare no-op Celery tasks on the same 2 processes, with the per-agent order checked.

Each phase pre-loads its work with no worker running (submissions through ``submit_messages``,
bare tasks through ``apply_async``), then starts two ``think-jobs worker`` subprocesses
(threads pool) and times from the first finished unit to the last (each unit marks its finish
in Redis with one pipelined round trip; turns do it from ``on_chat_response``), so worker
start-up is not counted. With ``--plain`` the agents override no hook, as most agents do (with
no hook after its final write, a turn's final write also claims the agent's next turn, in one
statement on PostgreSQL): they mark nothing, so the drain ends
when the database counts every turn completed and is timed from the first ``completed_at`` to
the last. Order is checked twice: the model records each turn's label as it
starts (must equal the admission order per agent), and the turns table must show, per agent,
every turn started after the previous one completed, in ``seq`` order.

    .venv/bin/python -m bench.fifo_throughput [--quick] [--agents 100 --per-agent 50] [--plain]
"""

from __future__ import annotations

import argparse
import itertools
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from bench import measure, report
from bench.agents import MARK_TASK, Ordered, OrderedPlain, counter_key, starts_key
from bench.report import Figure, Target
from bench.services import Scratch, scratch, worker_processes
from think_jobs import Think, ThinkJobs

TARGET = Target(">=", 0.5)
ZERO = Target("<=", 0, absolute=True)
_SUBMIT_THREADS = 4


def label_message(label: str) -> dict[str, Any]:
    return {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": label}]}


def _submit_agents(
    jobs: ThinkJobs, names: list[str], per_agent: int, agent_class: type[Think]
) -> None:
    for n, name in itertools.product(range(per_agent), names):
        jobs.get_agent(agent_class, name).submit_messages([label_message(f"{name}#{n}")])


def submit_all(
    jobs: ThinkJobs, *, agents: int, per_agent: int, agent_class: type[Think] = Ordered
) -> dict[str, list[str]]:
    """Interleaved submissions; each agent is fed by one thread, so its order is known."""
    names = [f"fifo-{a}" for a in range(agents)]
    shares = [names[i::_SUBMIT_THREADS] for i in range(_SUBMIT_THREADS)]
    with ThreadPoolExecutor(_SUBMIT_THREADS) as pool:
        feeding = [
            pool.submit(_submit_agents, jobs, share, per_agent, agent_class) for share in shares
        ]
        for done in feeding:
            done.result()
    return {name: [f"{name}#{n}" for n in range(per_agent)] for name in names}


def enqueue_bare(jobs: ThinkJobs, count: int) -> None:
    task = jobs.celery.tasks[MARK_TASK]
    for _ in range(count):
        task.apply_async(queue=jobs.settings.queue)


def reset_marks(jobs: ThinkJobs) -> None:
    jobs.redis.delete(*(counter_key(jobs, name) for name in ("first", "last", "done")))


@dataclass(frozen=True)
class Drain:
    seconds: float
    worker_cpu_s: float
    units: int

    @property
    def rate_per_s(self) -> float:
        return (self.units - 1) / self.seconds

    @property
    def cpu_ms_per_unit(self) -> float:
        return self.worker_cpu_s * 1000 / self.units


def drain(
    run: Scratch,
    *,
    expected: int,
    concurrency: int,
    timeout_s: float,
    plain: bool = False,
    extra_env: dict[str, str] | None = None,
) -> Drain:
    """Start 2 workers on what is queued; time from the first finish to the last, and the
    workers' CPU time from ready to done. ``plain``: turns that mark nothing, counted and
    timed in the database. ``extra_env``: the workers' settings that differ from ``run``'s."""
    jobs = run.jobs
    with worker_processes(run, count=2, concurrency=concurrency, extra_env=extra_env) as workers:
        cpu_before = sum(w.cpu_s() for w in workers)
        deadline = time.monotonic() + timeout_s
        while (completed(jobs) if plain else marked(jobs)) < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"work not finished in {timeout_s:g} s")
            run.namespace.check_intact(jobs.redis)
            time.sleep(0.1)
        cpu = sum(w.cpu_s() for w in workers) - cpu_before
    if plain:
        return Drain(completion_span_s(jobs), cpu, expected)
    first, last = (float(jobs.redis.get(counter_key(jobs, k)) or 0) for k in ("first", "last"))
    reset_marks(jobs)
    return Drain(last - first, cpu, expected)


def marked(jobs: ThinkJobs) -> int:
    return int(jobs.redis.get(counter_key(jobs, "done")) or 0)


def completed(jobs: ThinkJobs) -> int:
    query = sa.text("SELECT count(*) FROM think_turns WHERE status = 'completed'")
    with jobs.db.read() as conn:
        return int(conn.execute(query).scalar_one())


def completion_span_s(jobs: ThinkJobs) -> float:
    """From the first turn completed to the last, by the database's clock."""
    query = sa.text("SELECT min(completed_at), max(completed_at) FROM think_turns")
    with jobs.db.read() as conn:
        first, last = conn.execute(query).one()
    if isinstance(first, str):  # SQLite keeps ISO text
        first, last = datetime.fromisoformat(first), datetime.fromisoformat(last)
    return float((last - first).total_seconds())


def start_order_violations(jobs: ThinkJobs, admitted: dict[str, list[str]]) -> int:
    """Agents whose model calls did not start in admission order."""
    bad = 0
    for name, labels in admitted.items():
        raw = jobs.redis.lrange(starts_key(jobs, name), 0, -1)
        started = [item.decode() if isinstance(item, bytes) else item for item in raw]
        bad += started != labels
    return bad


def table_violations(jobs: ThinkJobs) -> tuple[int, int]:
    """(turns not completed, turns that started before their predecessor completed)."""
    query = sa.text(
        "SELECT agent_id, status, started_at, completed_at FROM think_turns ORDER BY agent_id, seq"
    )
    with jobs.db.read() as conn:
        rows = list(conn.execute(query))
    unfinished = sum(row.status != "completed" for row in rows)
    overlaps = sum(
        before.agent_id == after.agent_id and str(after.started_at) < str(before.completed_at)
        for before, after in itertools.pairwise(rows)
    )
    return unfinished, overlaps


@dataclass(frozen=True)
class Round:
    bare: Drain
    turns: Drain
    violations: int


def run_round(run: Scratch, args: argparse.Namespace) -> Round:
    """One bare phase and one think-jobs phase."""
    jobs, count = run.jobs, args.agents * args.per_agent
    timeout_s = 120 + count / 5
    enqueue_bare(jobs, count)
    bare = drain(run, expected=count, concurrency=args.concurrency, timeout_s=timeout_s)
    agent_class = OrderedPlain if args.plain else Ordered
    admitted = submit_all(
        jobs, agents=args.agents, per_agent=args.per_agent, agent_class=agent_class
    )
    turns = drain(
        run, expected=count, concurrency=args.concurrency, timeout_s=timeout_s, plain=args.plain
    )
    found = violations(jobs, admitted)
    clear_turns(jobs, admitted)
    return Round(bare, turns, found)


def violations(jobs: ThinkJobs, admitted: dict[str, list[str]]) -> int:
    """Order and exclusion violations of a drain, and turns it left unfinished."""
    unfinished, overlaps = table_violations(jobs)
    return start_order_violations(jobs, admitted) + unfinished + overlaps


def clear_turns(jobs: ThinkJobs, admitted: dict[str, list[str]]) -> None:
    """Forget a drained round: its turns, messages and recorded start orders."""
    with jobs.db.write() as conn:
        conn.execute(sa.text("DELETE FROM think_turns"))
        conn.execute(sa.text("DELETE FROM think_messages"))
    jobs.redis.delete(*(starts_key(jobs, name) for name in admitted))


def run_backend(backend: str, args: argparse.Namespace) -> list[Figure]:
    with scratch(backend) as run:
        rounds = [run_round(run, args) for _ in range(args.rounds)]
    bare = measure.median([r.bare.rate_per_s for r in rounds])
    turns = measure.median([r.turns.rate_per_s for r in rounds])
    bare_cpu = measure.median([r.bare.cpu_ms_per_unit for r in rounds])
    turn_cpu = measure.median([r.turns.cpu_ms_per_unit for r in rounds])
    violations = sum(r.violations for r in rounds)
    case = f"{backend}, {args.agents} agents x {args.per_agent}, 2 workers x {args.concurrency}"
    if args.plain:
        case += ", agents without hooks"
    return [
        Figure("fifo throughput", case, "turns/s", turns, bare, "bare no-op tasks/s", TARGET),
        Figure(
            "fifo throughput",
            case,
            "worker CPU per turn (ms)",
            turn_cpu,
            bare_cpu,
            "per bare task",
        ),
        Figure("fifo throughput", case, "order/exclusion violations", violations, target=ZERO),
    ]


def main(argv: list[str] | None = None) -> list[Figure]:
    parser = report.parser(__doc__.splitlines()[0], backends="postgres")
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--per-agent", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=2, help="threads per worker")
    parser.add_argument("--rounds", type=int, default=1, help="bare+think-jobs rounds")
    parser.add_argument(
        "--plain", action="store_true", help="agents without hooks (timed in the database)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.agents, args.per_agent = 10, 5
    return report.run_backends(args, run_backend)


if __name__ == "__main__":
    main()
