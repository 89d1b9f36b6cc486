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
  (``pg_failover.read_only``).

The first fault of a round hits a worker running a turn, at a chunk the seed chooses or in
the window after its model's last chunk, before its final write.

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

from tests.apps.agents import Journal
from tests.support.faults import Report, record_kill
from tests.support.fencing_faults import (
    Admitted,
    Load,
    _cut,
    _judge_tails,
    _through,
    busy_worker,
    finish,
    pause,
    skewed,
    submit,
)
from tests.support.pg_failover import read_only
from tests.support.processes import PrivateRedis, WorkerProcess
from tests.support.proxy import Proxy, proxy_to
from think_jobs import ThinkJobs

APP = "tests.apps.agents:jobs"
KINDS = ("pause", "kill", "cut-postgres", "cut-redis", "redis-restart", "postgres-failover")
_ONCE = frozenset({"redis-restart", "postgres-failover"})  # of the whole system: one at a time
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

    @property
    def faults(self) -> int:
        return sum(len(injected) for injected in self.rounds)

    def describe(self) -> str:
        counts = {kind: sum(r.count(kind) for r in self.rounds) for kind in KINDS}
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
            routed = _through(_through(env, "postgres", postgres_proxy), "redis", redis_proxy)
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
) -> tuple[Report, Schedule]:
    """Drain ``load`` with three workers while ``rounds`` rounds of mixed faults are injected
    (each once a worker runs a turn); judge the outcome."""
    ttl_s = float(env["THINK_JOBS_LEASE_TTL_S"])
    chooser, schedule = random.Random(seed), Schedule(seed)
    admitted = submit(jobs, load)
    with slots(env, redis) as workers:
        for _ in range(rounds):
            kinds = _choose(chooser)
            injected = _round(jobs, admitted, workers, redis, kinds, ttl_s, chooser)
            if injected is None:
                break
            schedule.rounds.append(injected)
        report = finish(jobs, admitted, Report("mixed faults", faults=schedule.faults))
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
