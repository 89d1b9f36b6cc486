"""Faults mixed under one load (a *nemesis*, as Jepsen calls it), shared by a reliability
test and ``bench/reliability.py``.

Each fault scenario of ``fencing_faults`` injects one kind of fault at a time into a calm
system. Production does not wait for the system to be calm: a worker is paused while another
is cut off, Redis restarts while a paused worker's lease is being taken over. Here three
workers drain one load, each reaching PostgreSQL and a private Redis through proxies of its
own (so it alone can be cut from either server); one runs 60 s ahead, one 60 s behind. A
seeded schedule of rounds injects, in each, one or two of these at once, on distinct
workers:

- ``pause``: SIGSTOP a worker running a turn for 3x the lease TTL, then SIGCONT;
- ``kill``: SIGKILL a worker running a turn, and start a replacement (same clock, proxies);
- ``cut-postgres`` / ``cut-redis``: cut a worker from that server alone for 3x the lease TTL;
- ``redis-restart``: Redis (broker and streams) stopped, started again empty 1 s later;
- ``postgres-failover``: PostgreSQL refusing writes for 2 s, its sessions ended
  (``pg_failover.read_only``);
- and, in a quarter of the rounds, a client cancelling the turn the first fault hits, at a
  moment the seed chooses within twice the lease TTL (it may end ``aborted``, and a status
  seen ``aborted`` must stay so).

The first fault of a round hits a worker running a turn, at a chunk the seed chooses or in
the window after its model's last chunk, before its final write. Meanwhile a producer, as a
webhook receiver would, submits ``arrivals`` more turns one by one with an idempotency key,
trying again while the database refuses (``StorageUnavailableError``), and delivers each a
second time once accepted: the second delivery must name the same submission.

The outcome is judged as every fault scenario's is (``faults.check``, ``zombie_tails``): from
the journal no fault touches, the public API and the streams a client reads.
"""

from __future__ import annotations

import os
import random
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.apps.agents import Journal, Recorder
from tests.support.builders import directive
from tests.support.faults import Report, record_kill
from tests.support.fencing_faults import (
    Admitted,
    Load,
    _cut,
    _judge_tails,
    busy_worker,
    finish,
    open_calls,
    pause,
    skewed,
    submit,
    through,
)
from tests.support.pg_failover import read_only
from tests.support.processes import PrivateRedis, WorkerProcess
from tests.support.proxy import Proxy, proxy_to
from think_jobs import StorageUnavailableError, ThinkJobs, ThinkJobsError

APP = "tests.apps.agents:jobs"
KINDS = ("pause", "kill", "cut-postgres", "cut-redis", "redis-restart", "postgres-failover")
_ONCE = frozenset({"redis-restart", "postgres-failover"})  # of the whole system: one at a time
CANCEL_SHARE = 0.25  # of the rounds, where a client also cancels the turn the fault hits
CLOCKS = (None, "+60s", "-60s")


@dataclass
class Slot:
    """One worker's place: its settings (proxies, clock) and the process filling it now."""

    env: dict[str, str]
    postgres: Proxy
    redis: Proxy
    process: WorkerProcess | None = None

    started: list[WorkerProcess] = field(default_factory=list)

    def start(self) -> None:
        self.process = WorkerProcess(self.env, app=APP, concurrency=2, pool="threads")
        self.started.append(self.process)
        self.process.wait_ready(60)


@dataclass
class Schedule:
    """What was injected, round by round (``seed`` replays the same choices)."""

    seed: int
    rounds: list[list[str]] = field(default_factory=list)
    cancels: dict[str, str] = field(default_factory=dict)  # label -> its status once cancelled

    @property
    def faults(self) -> int:
        return sum(len(injected) for injected in self.rounds)

    def describe(self) -> str:
        counts = {kind: sum(r.count(kind) for r in self.rounds) for kind in (*KINDS, "cancel")}
        doubles = sum(len(r) > 1 for r in self.rounds)
        listed = ", ".join(f"{kind} {n}" for kind, n in counts.items() if n)
        return f"seed {self.seed}: {listed}; {doubles} rounds with two faults at once"


@contextmanager
def slots(env: dict[str, str], redis: PrivateRedis, count: int = 3) -> Iterator[list[Slot]]:
    """``count`` workers, each through proxies of its own, on the clocks of ``CLOCKS``."""
    with ExitStack() as stack:
        made = []
        for index in range(count):
            postgres_proxy = stack.enter_context(proxy_to(_database_port(env)))
            redis_proxy = stack.enter_context(proxy_to(redis.port))
            routed = through(through(env, "postgres", postgres_proxy), "redis", redis_proxy)
            clock = CLOCKS[index % len(CLOCKS)]
            made.append(
                Slot(skewed(routed, clock) if clock else routed, postgres_proxy, redis_proxy)
            )
        try:
            for slot in made:
                slot.start()
            yield made
        finally:
            for slot in made:
                for proxy in (slot.postgres, slot.redis):
                    proxy.heal()
                if slot.process is not None:
                    slot.process.process.send_signal(signal.SIGCONT)
                    slot.process.stop()


def _database_port(env: dict[str, str]) -> int:
    host = env["THINK_JOBS_DATABASE_URL"].rpartition("@")[2].partition("/")[0]
    return int(host.rpartition(":")[2]) if ":" in host else 5432


def nemesis(
    jobs: ThinkJobs,
    env: dict[str, str],
    redis: PrivateRedis,
    *,
    load: Load,
    rounds: int,
    seed: int,
    arrivals: int = 0,
) -> tuple[Report, Schedule]:
    """Drain ``load`` with three workers while ``rounds`` rounds of mixed faults are injected
    (each once a worker runs a turn; a load drained before the last round gets one more turn
    per agent, so every round runs however slow the machine); judge the outcome."""
    ttl_s = float(env["THINK_JOBS_LEASE_TTL_S"])
    chooser, schedule = random.Random(seed), Schedule(seed)
    admitted = submit(jobs, load)
    with slots(env, redis) as workers:
        producer = Producer(jobs, load, admitted, arrivals)
        producer.start()
        kinds, topped_up = _choose(chooser), 0
        while len(schedule.rounds) < rounds:
            injected = _round(jobs, admitted, workers, redis, kinds, ttl_s, chooser, schedule)
            if injected is not None:
                schedule.rounds.append(injected)
                kinds = _choose(chooser)
            elif producer.is_alive():
                time.sleep(0.1)  # nothing running now: more is arriving
            elif topped_up < rounds:  # the load ended first (a slow machine): more of it
                _top_up(jobs, load, admitted, topped_up)
                topped_up += 1
            else:
                break
        producer.join()
        report = Report("mixed faults", faults=schedule.faults)
        report = finish(jobs, admitted, report, cancelled=set(schedule.cancels))
        producer.judge(report)
        _judge_cancels(jobs, admitted, schedule, report)
        exited = [s for s in workers if s.process is None or s.process.process.poll() is not None]
        if exited:
            report.problems.append(f"{len(exited)} worker(s) exited by themselves")
    report.problems.append(schedule.describe())
    report = _judge_tails(jobs, report)
    if any(report.anomalies):
        report.problems.append(f"the workers' logs: {_keep_logs(workers, seed)}")
    return report, schedule


def _keep_logs(workers: list[Slot], seed: int) -> Path:
    """Every worker's output (replaced ones too), for the anomaly's post-mortem."""
    path = Path(tempfile.gettempdir()) / f"tj-nemesis-{seed}-{os.getpid()}.log"
    with path.open("w") as out:
        for slot in workers:
            for process in slot.started:
                out.write(f"==== worker pid {process.process.pid}\n")
                out.writelines(process.output)
    return path


def _cancel(
    jobs: ThinkJobs, admitted: Admitted, call: dict[str, Any], delay_s: float, schedule: Schedule
) -> None:
    """``delay_s`` after the round began, cancel the submission ``call`` runs, as a client
    would (trying again while the database refuses); note its status once cancelled."""
    time.sleep(delay_s)  # where in the faults the cancel lands
    name, label = call["agent"], call["label"]
    submission = next(sid for lbl, sid in admitted[name] if lbl == label)
    agent = jobs.get_agent(Recorder, name)
    deadline = time.monotonic() + 60
    while True:
        try:
            agent.cancel_submission(submission, reason="cancelled by the nemesis")
            found = agent.inspect_submission(submission)
            break
        except ThinkJobsError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    schedule.cancels[label] = found.status if found is not None else "missing"


def _judge_cancels(jobs: ThinkJobs, admitted: Admitted, schedule: Schedule, report: Report) -> None:
    """A submission seen ``aborted`` once cancelled stays so (SPEC: the status is never
    overwritten later)."""
    for label, seen in schedule.cancels.items():
        name = label.split("#", 1)[0]
        submission = next(sid for lbl, sid in admitted[name] if lbl == label)
        found = jobs.get_agent(Recorder, name).inspect_submission(submission)
        final = found.status if found is not None else "missing"
        if seen == "aborted" and final != "aborted":
            report.stale_writes += 1
            report.problems.append(f"{label}: aborted by its cancel, then {final}")
    report.problems.append(
        f"{len(schedule.cancels)} running turns cancelled during the faults, "
        f"{report.aborted} ended aborted"
    )


class Producer(threading.Thread):
    """Submits ``count`` turns to the load's agents in turn, 0.2 s apart, each with an
    idempotency key: tried again while the database refuses, then delivered a second time."""

    def __init__(self, jobs: ThinkJobs, load: Load, admitted: Admitted, count: int) -> None:
        super().__init__(daemon=True)
        self.jobs, self.load, self.admitted, self.count = jobs, load, admitted, count
        self.refused = 0  # deliveries the database refused (then tried again)
        self.mismatches: list[str] = []  # second deliveries that named another submission

    def run(self) -> None:
        try:
            self._produce()
        except Exception as error:  # judged: a producer that gave up is a failure
            self.mismatches.append(f"the producer gave up: {error!r}")

    def _produce(self) -> None:
        text = " ".join(f"w{i}" for i in range(self.load.words))
        for n in range(self.count):
            name = f"agent-{n % self.load.agents}"
            label = f"{name}#late{n}"
            spec = {"label": label, "text": text, "delay_s": self.load.delay_s}
            message = directive(f"m-{label}", **spec, **_held(self.load))
            agent = self.jobs.get_agent(Recorder, name)
            first = self._deliver(agent, message, label)
            self.admitted[name].append((label, first))
            again = self._deliver(agent, message, label)
            if again != first:
                self.mismatches.append(f"{label}: delivered again, named {again}, not {first}")
            time.sleep(0.2)  # the arrivals spread over the rounds

    def _deliver(self, agent: Recorder, message: dict[str, Any], key: str) -> str:
        deadline = time.monotonic() + 60
        while True:
            try:
                return agent.submit_messages([message], idempotency_key=key).submission_id
            except StorageUnavailableError:
                self.refused += 1
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)  # as a webhook sender retries

    def judge(self, report: Report) -> None:
        report.duplicated += len(self.mismatches)
        report.problems.extend(self.mismatches)
        report.problems.append(
            f"{self.count} turns arrived during the faults, each delivered twice; "
            f"{self.refused} deliveries refused by the database and tried again"
        )


def _top_up(jobs: ThinkJobs, load: Load, admitted: Admitted, n: int) -> None:
    """One more turn for each agent of ``load``, for rounds the load did not last through."""
    text = " ".join(f"w{i}" for i in range(load.words))
    for name in admitted:
        label = f"{name}#more{n}"
        spec = {"label": label, "text": text, "delay_s": load.delay_s, **_held(load)}
        agent = jobs.get_agent(Recorder, name)
        result = agent.submit_messages([directive(f"m-{label}", **spec)])
        admitted[name].append((label, result.submission_id))


def _held(load: Load) -> dict[str, float]:
    return {"hold_s": load.hold_s} if load.hold_s else {}


def _choose(chooser: random.Random) -> list[str]:
    """One fault, or two at once (never the same fault of the whole system twice)."""
    first = chooser.choice(KINDS)
    if chooser.random() < 0.5:
        return [first]
    second = chooser.choice([k for k in KINDS if not (k == first and k in _ONCE)])
    return [first, second]


def _round(
    jobs: ThinkJobs,
    admitted: Admitted,
    workers: list[Slot],
    redis: PrivateRedis,
    kinds: list[str],
    ttl_s: float,
    chooser: random.Random,
    schedule: Schedule,
) -> list[str] | None:
    """Inject ``kinds`` at once, the first on a worker running a turn (at a chunk the seed
    chooses), the other on another worker; return once every fault of the round is over
    (None: the load had finished)."""
    live = [slot for slot in workers if slot.process is not None]
    chunks = chooser.randint(1, 40)  # where in its turn the first fault hits (40: at its end)

    def ready(call: dict[str, Any]) -> bool:
        return bool(call["holding"]) if chunks == 40 else call["chunks"] >= chunks

    busy = busy_worker(jobs, [s.process for s in live if s.process], ready, admitted)
    if busy is None:
        return None
    first = next(slot for slot in live if slot.process is busy)
    others = [slot for slot in live if slot is not first]
    targets = [first, chooser.choice(others)]
    actions = [
        _action(jobs, kind, target, redis, ttl_s)
        for kind, target in zip(kinds, targets, strict=False)
    ]
    journal = Journal(jobs)
    for kind, target in zip(kinds, targets, strict=False):
        pid = target.process.process.pid if target.process else 0
        journal.write({"what": "injected", "kind": kind, "pid": pid, "t": time.time()})
    call = next((c for c in open_calls(jobs) if c["pid"] == busy.process.pid), None)
    if call is not None and chooser.random() < CANCEL_SHARE:  # a client cancels that turn too
        delay_s = chooser.uniform(0, 2 * ttl_s)
        actions.append(lambda: _cancel(jobs, admitted, call, delay_s, schedule))
        kinds = [*kinds, "cancel"]
    threads = [threading.Thread(target=action) for action in actions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return kinds


def _action(
    jobs: ThinkJobs, kind: str, slot: Slot, redis: PrivateRedis, ttl_s: float
) -> Callable[[], None]:
    process = slot.process
    assert process is not None

    def kill() -> None:
        record_kill(jobs, process.process.pid)
        process.kill()
        slot.start()

    def restart_redis() -> None:
        redis.stop()
        time.sleep(1.0)  # the outage itself
        redis.start()

    def fail_over_postgres() -> None:
        with read_only(jobs.settings.database_url.rsplit("/", 1)[1]):
            time.sleep(2.0)  # the fault itself

    actions: dict[str, Callable[[], None]] = {
        "pause": lambda: pause(jobs, process, 3 * ttl_s, lease_ttl_s=ttl_s),
        "kill": kill,
        "cut-postgres": lambda: _cut(jobs, slot.postgres, 3 * ttl_s),
        "cut-redis": lambda: _cut(jobs, slot.redis, 3 * ttl_s),
        "redis-restart": restart_redis,
        "postgres-failover": fail_over_postgres,
    }
    return actions[kind]
