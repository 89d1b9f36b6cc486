"""Accept: ``submit_messages`` against a bare INSERT+COMMIT plus a bare Celery ``apply_async``.

Every submission goes to an agent with nothing queued, so each one is at the head of its
agent's queue and really enqueues Celery work (no worker runs: the queue is emptied between
rounds). The bare pair inserts a similar row (JSON messages and metadata) into a scratch table
that has only a primary key, commits, and sends a no-op task from a plain Celery app on the
same broker and queue.

    .venv/bin/python -m bench.accept [--quick] [--backends postgres,sqlite] [--count N]
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import sqlalchemy as sa
from celery import Celery

from bench import measure, report
from bench.agents import NOOP_TASK, OneChunk
from bench.measure import Latency
from bench.report import Figure, Target
from bench.services import Scratch, scratch
from think_jobs.context import utcnow
from think_jobs.db.engine import create_db_engine

TARGET = Target(">=", 1.0)  # issue 19: at least a bare INSERT+COMMIT and apply_async
PAIR = "INSERT+COMMIT + apply_async"
_META = sa.MetaData()
SCRATCH = sa.Table(
    "bench_scratch",
    _META,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("agent_id", sa.Integer, nullable=False),
    sa.Column("request_id", sa.String(255), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("messages", sa.JSON),
    sa.Column("metadata", sa.JSON),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)


def user_message(index: int) -> dict[str, Any]:
    text = f"Order #{index} arrived damaged; please arrange a replacement and confirm by email."
    return {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": text}]}


def plain_celery(broker_url: str) -> Celery:
    """A Celery app with default settings (JSON) and one no-op task: the bare ingredient."""
    app = Celery("bench-bare", broker=broker_url, set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"], task_ignore_result=True)
    app.task(name=NOOP_TASK, ignore_result=True, shared=False)(_noop)
    return app


def _noop() -> None:
    return None


@dataclass
class Samples:
    """Latency samples per series, accumulated over interleaved rounds."""

    series: dict[str, Latency] = field(default_factory=dict)
    rates: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, latency: Latency) -> None:
        self.series[name] = self.series.get(name, Latency(())) + latency
        self.rates.setdefault(name, []).append(latency.rate_per_s)

    def rate(self, name: str) -> float:
        return measure.median(self.rates[name])


class AcceptBench:
    """The operations timed, on one scratch environment."""

    def __init__(self, run: Scratch, *, agents: int) -> None:
        self.run = run
        self.jobs = run.jobs
        self.engine = create_db_engine(run.database_url, pool_size=2)
        _META.create_all(self.engine)
        self.bare_app = plain_celery(run.namespace.redis_url)
        self.noop = self.bare_app.tasks[NOOP_TASK]
        self.agents = [self.jobs.get_agent(OneChunk, f"accept-{i}") for i in range(agents)]
        for agent in self.agents:
            agent.start()
        self.round = 0

    def close(self) -> None:
        self.engine.dispose()
        self.bare_app.close()

    # -- the bare ingredients ------------------------------------------------------------------

    def bare_insert(self, index: int) -> None:
        row = {
            "agent_id": index,
            "request_id": str(uuid.uuid4()),
            "status": "pending",
            "messages": [user_message(index)],
            "metadata": {"source": "bench"},
            "created_at": utcnow(),
        }
        with self.engine.begin() as conn:
            conn.execute(SCRATCH.insert().values(**row))

    def bare_apply(self, index: int) -> None:
        self.noop.apply_async(queue=self.jobs.settings.queue)

    def bare_pair(self, index: int) -> None:
        self.bare_insert(index)
        self.bare_apply(index)

    def same_app_apply(self, index: int) -> None:
        """A no-op send on think-jobs' own Celery app (its configuration, its producer pool)."""
        self.jobs.celery.send_task(NOOP_TASK, queue=self.jobs.settings.queue)

    # -- think-jobs ----------------------------------------------------------------------------

    def accept(self, index: int) -> None:
        self.agents[index].submit_messages([user_message(index)], metadata={"source": "bench"})

    def accept_keyed(self, index: int) -> None:
        key = f"order-{self.round}-{index}"
        self.agents[index].submit_messages([user_message(index)], idempotency_key=key)

    def duplicate(self, index: int) -> None:
        key = f"order-{self.round}-{index}"
        result = self.agents[index].submit_messages([user_message(index)], idempotency_key=key)
        assert not result.accepted

    # -- between series ------------------------------------------------------------------------

    def settle(self, expected_sends: int | None = None) -> None:
        """Empty the queue (checking that ``expected_sends`` drains were sent) and end the
        pending submissions."""
        queue = self.jobs.settings.queue
        sent = int(self.jobs.redis.llen(queue))
        self.jobs.redis.delete(queue)
        if expected_sends is not None and sent != expected_sends:
            print(f"warning: expected {expected_sends} Celery sends, found {sent}", flush=True)
        with self.jobs.db.write() as conn:
            conn.execute(
                sa.text(
                    "UPDATE think_turns SET status = 'completed', completed_at = created_at "
                    "WHERE status = 'pending'"
                )
            )


def run_round(bench: AcceptBench, samples: Samples, *, count: int, gap_s: float) -> None:
    """One round of every series, interleaved so that drift hits them alike. After each
    series the queue is emptied (checking the submissions each sent one drain) and pending
    submissions are ended, so every agent is idle again."""
    bench.round += 1
    series: list[tuple[str, Callable[[int], object], bool]] = [
        ("pair", bench.bare_pair, False),
        ("accept", bench.accept, True),
        ("insert", bench.bare_insert, False),
        ("apply", bench.bare_apply, False),
        ("same-app apply", bench.same_app_apply, False),
    ]
    for name, call, sends in series:
        samples.add(name, measure.sample(call, count=count, gap_s=gap_s))
        bench.settle(count if sends else None)
    samples.add("keyed", measure.sample(bench.accept_keyed, count=count, gap_s=gap_s))
    bench.jobs.redis.delete(bench.jobs.settings.queue)  # keep the keyed submissions pending
    samples.add("duplicate", measure.sample(bench.duplicate, count=count, gap_s=gap_s))
    bench.settle(count)


def figures_of(backend: str, regime: str, samples: Samples) -> list[Figure]:
    case = f"{backend}, {regime}"
    s = samples.series

    def vs_pair(metric: str, value: float, reference: float) -> Figure:
        return Figure("accept", case, metric, value, reference, PAIR)

    pair = s["pair"]
    found = [
        vs_pair("p50 (ms)", s["accept"].p50, pair.p50),
        vs_pair("p99 (ms)", s["accept"].p99, pair.p99),
        vs_pair("duplicate p50 (ms)", s["duplicate"].p50, pair.p50),
        vs_pair("duplicate p99 (ms)", s["duplicate"].p99, pair.p99),
        vs_pair("with idempotency key p50 (ms)", s["keyed"].p50, pair.p50),
        Figure("accept", case, "bare INSERT+COMMIT p50 (ms)", s["insert"].p50),
        Figure("accept", case, "bare apply_async p50 (ms)", s["apply"].p50),
        Figure(
            "accept",
            case,
            "send on think-jobs' Celery app p50 (ms)",
            s["same-app apply"].p50,
            s["apply"].p50,
            "bare apply_async",
        ),
    ]
    if regime == "back to back":
        found.insert(2, vs_pair("client CPU per call p50 (ms)", s["accept"].cpu_p50, pair.cpu_p50))
        rate = vs_pair("throughput (submits/s)", samples.rate("accept"), samples.rate("pair"))
        found.insert(0, replace(rate, target=TARGET))
    return found


def run_backend(backend: str, args: argparse.Namespace) -> list[Figure]:
    figures: list[Figure] = []
    with scratch(backend) as run:
        bench = AcceptBench(run, agents=args.count)
        try:
            run_round(bench, Samples(), count=min(50, args.count), gap_s=0)  # warm-up
            for regime, gap_s in measure.regimes(gapped=not args.no_gaps):
                count = args.count if gap_s == 0 else args.gapped_count
                samples = Samples()
                for _ in range(args.rounds):
                    run_round(bench, samples, count=count, gap_s=gap_s)
                figures += figures_of(backend, regime, samples)
        finally:
            bench.close()
    return figures


def main(argv: list[str] | None = None) -> list[Figure]:
    parser = report.parser(__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=500, help="calls per series per round")
    parser.add_argument("--gapped-count", type=int, default=60, help="calls with idle gaps")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--no-gaps", action="store_true", help="skip the idle-gap regime")
    args = parser.parse_args(argv)
    if args.quick:
        args.count, args.gapped_count, args.rounds = 60, 10, 1
    return report.run_backends(args, run_backend)


if __name__ == "__main__":
    main()
