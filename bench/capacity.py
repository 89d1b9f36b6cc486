"""Capacity for real LLM turns: N agents each running one slow turn at once on one worker,
against bare Celery tasks that publish the same tokens at the same pace.

One ``think-jobs worker`` subprocess (threads pool, concurrency N, PostgreSQL) starts with N
turns waiting for it: each streams 50 tokens at 20 tokens/s (``bench.agents.SlowTokens``,
~2.5 s, the ideal). The N submissions are made before the worker starts, so what is measured
is the turns, not the accepts. The bare reference is a fresh worker of the same pool and
concurrency starting with N tasks that PUBLISH the same 50 tokens, as fast, on the client and
pool a turn's stream uses. Measured: wall time from the worker being ready to the last
turn's end, ÷ 2.5 s; when the last turn started (its claim; a bare task's first line),
which tells the time spent starting N turns from the time they ran; worker CPU per token and
per turn; RSS per in-flight turn (peak RSS over the run minus
RSS at ready, ÷ N); PostgreSQL connections of the worker, open and inside a transaction
(pg_stat_activity, sampled every 50 ms: a turn waiting on its model holds none); and every
turn's stream, read back with ``agent.stream()`` and compared with its stored reply (one
``done``, contiguous seqs, every event written live by the turn's attempt) — plus a few
readers that follow their turn live from before it started.

    .venv/bin/python -m bench.capacity [--quick] [--n 100,500,1000] [--pool threads]
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench import report
from bench.agents import (
    SLOW_TOKEN_DELAY_S,
    SLOW_TOKENS,
    TOKENS_TASK,
    SlowTokens,
    counter_key,
    ready_key,
)
from bench.report import Figure, Target
from bench.services import Scratch, WorkerProcess, pg_admin, scratch
from think_jobs import StreamEvent, Think
from think_jobs.messages import message_text

IDEAL_S = SLOW_TOKENS * SLOW_TOKEN_DELAY_S
LIVE_READERS = 20
_SAMPLE_S = 0.05
_TOKEN_TEXT = "tok " * SLOW_TOKENS


@dataclass
class Samples:
    """What the sampler saw of the worker while it ran."""

    rss_kib: list[int] = field(default_factory=list)
    pg_open: list[int] = field(default_factory=list)
    pg_busy: list[int] = field(default_factory=list)  # in a transaction or a statement


@dataclass(frozen=True)
class Phase:
    """One worker run: N turns (or bare tasks) from the worker's start to the last end;
    ``starts_s``: when each began (the turn's claim; the task's first line), seconds after
    the worker was ready."""

    n: int
    wall_s: float
    cpu_s: float
    rss_at_ready_kib: int
    samples: Samples
    starts_s: list[float] = field(default_factory=list)

    @property
    def last_start_s(self) -> float:
        return max(self.starts_s, default=0.0)

    @property
    def cpu_ms_per_turn(self) -> float:
        return self.cpu_s * 1e3 / self.n

    @property
    def cpu_us_per_token(self) -> float:
        return self.cpu_s * 1e6 / (self.n * SLOW_TOKENS)

    @property
    def rss_kib_per_turn(self) -> float:
        return (max(self.samples.rss_kib, default=0) - self.rss_at_ready_kib) / self.n


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


WORKER_APPLICATION = "tj-capacity-worker"  # the worker's connections, as PostgreSQL names them
_PG_QUERY = (
    "SELECT count(*), count(*) FILTER (WHERE state <> 'idle') FROM pg_stat_activity "
    "WHERE datname = %s AND application_name = %s"
)


@contextmanager
def sampling(pid: int, database: str) -> Iterator[Samples]:
    """Sample the worker's RSS and its PostgreSQL connections until the block ends."""
    samples = Samples()
    stop = threading.Event()

    def sample() -> None:
        with pg_admin() as admin:
            while not stop.wait(_SAMPLE_S):
                samples.rss_kib.append(_rss_kib(pid))
                row = admin.execute(_PG_QUERY, (database, WORKER_APPLICATION)).fetchone()
                if row is not None:
                    samples.pg_open.append(int(row[0]))
                    samples.pg_busy.append(int(row[1]))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join(10)


def _reset_counters(run: Scratch) -> None:
    names = ("first", "done", "last", "starts")
    run.jobs.redis.delete(*(counter_key(run.jobs, name) for name in names))
    run.jobs.redis.delete(ready_key(run.jobs))


def _finished(run: Scratch) -> int:
    return int(run.jobs.redis.get(counter_key(run.jobs, "done")) or 0)


def _started_worker(run: Scratch, pool: str, n: int) -> tuple[WorkerProcess, float]:
    """A worker of ``pool`` with ``n`` slots and the wall-clock time it was seen ready."""
    url = f"{run.database_url}?application_name={WORKER_APPLICATION}"
    worker = WorkerProcess({**run.env, "THINK_JOBS_DATABASE_URL": url}, concurrency=n, pool=pool)
    deadline = time.monotonic() + 60
    while not run.jobs.redis.sismember(ready_key(run.jobs), str(worker.process.pid)):
        if time.monotonic() > deadline or worker.process.poll() is not None:
            worker.stop()
            raise RuntimeError("worker did not start:\n" + "".join(worker.output[-40:]))
        time.sleep(0.005)
    return worker, time.time()


def run_phase(
    run: Scratch, pool: str, n: int, enqueue: Callable[[], None], starts: Callable[[], list[float]]
) -> Phase:
    """Enqueue N units of work, start a worker, wait until all N finished, stop it; ``starts``
    gives when each unit started (epoch seconds), read once all have finished."""
    _reset_counters(run)
    enqueue()
    worker, ready_at = _started_worker(run, pool, n)
    try:
        cpu_before, rss_before = worker.cpu_s(), _rss_kib(worker.process.pid)
        database = run.database_url.rsplit("/", 1)[1]
        with sampling(worker.process.pid, database) as samples:
            deadline = time.monotonic() + 60 + n * 0.2
            while _finished(run) < n:
                if time.monotonic() > deadline or worker.process.poll() is not None:
                    raise RuntimeError(f"{_finished(run)} of {n} finished in time")
                time.sleep(0.02)
        cpu = worker.cpu_s() - cpu_before
        last = float(run.jobs.redis.get(counter_key(run.jobs, "last")) or 0)
    finally:
        worker.stop()
    failures = [line for line in worker.output if "ERROR" in line or "Too many" in line]
    if failures:
        print("".join(failures[:10]), flush=True)
    began = [at - ready_at for at in starts()]
    return Phase(n, last - ready_at, cpu, rss_before, samples, began)


# -- think-jobs turns and their streams ---------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    agent: Think
    request_id: str


def _submit_turns(run: Scratch, n: int, tag: str) -> list[Turn]:
    turns = []
    for index in range(n):
        agent = run.jobs.get_agent(SlowTokens, f"cap-{tag}-{index}")
        request_id = str(uuid.uuid4())
        message = {
            "id": uuid.uuid4().hex,
            "role": "user",
            "parts": [{"type": "text", "text": "go"}],
        }
        agent.submit_messages([message], submission_id=request_id)
        turns.append(Turn(agent, request_id))
    return turns


def dropped_chunks(turn: Turn, events: list[StreamEvent]) -> int:
    """Text chunks the stream lacks against the stored reply (every token, if the stream is
    not exactly the reply: seqs contiguous, one ``done`` last, all written by attempt 1)."""
    live = [e for e in events if e.attempt == 1]
    deltas = [e.chunk for e in live if e.chunk is not None and e.chunk["type"] == "text-delta"]
    text = "".join(str(chunk["delta"]) for chunk in deltas)
    stored = message_text(turn.agent.get_messages()[-1])
    intact = (
        [e.seq for e in events] == list(range(len(events)))
        and [e.done for e in events].count(True) == 1
        and events[-1].done
        and events[-1].status == "completed"
        and len(live) == len(events)
        and text == stored == _TOKEN_TEXT
    )
    return 0 if intact else max(0, SLOW_TOKENS - len(deltas))


@dataclass(frozen=True)
class Streams:
    dropped: int
    broken_turns: int
    live_dropped: int


def check_streams(turns: list[Turn], live: list[tuple[Turn, Future[list[StreamEvent]]]]) -> Streams:
    dropped = broken = 0
    for turn in turns:
        lost = dropped_chunks(turn, list(turn.agent.stream(turn.request_id, live=False)))
        dropped += lost
        broken += lost > 0
    live_dropped = sum(dropped_chunks(turn, future.result(timeout=60)) for turn, future in live)
    return Streams(dropped, broken, live_dropped)


def think_jobs_phase(run: Scratch, pool: str, n: int) -> tuple[Phase, Streams]:
    turns: list[Turn] = []
    with ThreadPoolExecutor(LIVE_READERS) as readers:
        live: list[tuple[Turn, Future[list[StreamEvent]]]] = []

        def enqueue() -> None:
            turns.extend(_submit_turns(run, n, uuid.uuid4().hex[:6]))
            for turn in turns[:: max(1, n // LIVE_READERS)][:LIVE_READERS]:
                events = turn.agent.stream(turn.request_id, timeout_s=120)  # subscribed now
                live.append((turn, readers.submit(list, events)))

        def starts() -> list[float]:
            inspected = [turn.agent.inspect_submission(turn.request_id) for turn in turns]
            return [i.started_at.timestamp() for i in inspected if i and i.started_at]

        phase = run_phase(run, pool, n, enqueue, starts)
        return phase, check_streams(turns, live)


def bare_phase(run: Scratch, pool: str, n: int) -> Phase:
    task = run.jobs.celery.tasks[TOKENS_TASK]
    channel = run.namespace.key("bare-tokens")

    def enqueue() -> None:
        for _ in range(n):
            task.apply_async(args=[channel])

    def starts() -> list[float]:
        return [float(at) for at in run.jobs.redis.lrange(counter_key(run.jobs, "starts"), 0, -1)]

    return run_phase(run, pool, n, enqueue, starts)


# -- figures -------------------------------------------------------------------------------------


def figures_of(
    pool: str, n: int, turns: Phase, bare: Phase, streams: Streams, live_readers: int
) -> list[Figure]:
    case = f"postgres, {pool} pool, N={n:,} turns at once"
    ideal = f"{IDEAL_S:g} s ideal"
    bare_name = "bare tasks publishing the tokens"
    goal = Target("<=", 1.1, absolute=True) if n == 500 else None
    live_name = f"chunks dropped ({live_readers} live readers)"
    busy = turns.samples.pg_busy or [0]
    cpu = (turns.cpu_us_per_token, bare.cpu_us_per_token)
    cpu_turn = (turns.cpu_ms_per_turn, bare.cpu_ms_per_turn)
    last_start = (turns.last_start_s, bare.last_start_s)
    rss = (turns.rss_kib_per_turn, bare.rss_kib_per_turn)
    none = Target("<=", 0, absolute=True)
    return [
        Figure("capacity", case, "wall time ÷ ideal", turns.wall_s / IDEAL_S, 1.0, ideal, goal),
        Figure("capacity", case, "wall time (s)", turns.wall_s, bare.wall_s, bare_name),
        Figure("capacity", case, "last start after ready (s)", *last_start, bare_name),
        Figure("capacity", case, "worker CPU per token (µs)", *cpu, bare_name),
        Figure("capacity", case, "worker CPU per turn (ms)", *cpu_turn, bare_name),
        Figure("capacity", case, "RSS per in-flight turn (KiB)", *rss, bare_name),
        Figure("capacity", case, "worker PG connections open, peak", max(turns.samples.pg_open)),
        Figure("capacity", case, "... in a transaction, median", statistics.median(busy)),
        Figure("capacity", case, "... in a transaction, peak", max(busy)),
        Figure("capacity", case, "chunks dropped (all turns)", streams.dropped, target=none),
        Figure("capacity", case, "turns whose stream is not the reply", streams.broken_turns),
        Figure("capacity", case, live_name, streams.live_dropped, target=none),
        Figure("capacity", case, "bare wall time ÷ ideal", bare.wall_s / IDEAL_S),
    ]


def run_case(run: Scratch, pool: str, n: int) -> list[Figure]:
    turns, streams = think_jobs_phase(run, pool, n)
    bare = bare_phase(run, pool, n)
    return figures_of(pool, n, turns, bare, streams, min(n, LIVE_READERS))


def main(argv: list[str] | None = None) -> list[Figure]:
    parser = report.parser(__doc__.splitlines()[0], backends=None)
    parser.add_argument("--n", default="100,500,1000", help="comma-separated turn counts")
    parser.add_argument("--pool", default="threads", help="comma-separated Celery pools")
    args = parser.parse_args(argv)
    counts = [100] if args.quick else [int(n) for n in args.n.split(",")]
    pools = [p.strip() for p in args.pool.split(",") if p.strip()]
    figures: list[Figure] = []
    with scratch("postgres") as run:
        for pool in pools:
            for n in counts:
                case_figures = run_case(run, pool, n)
                figures += case_figures
                print(report.table(case_figures), flush=True)
    print()
    report.publish(figures, args)
    return figures


if __name__ == "__main__":
    main()
