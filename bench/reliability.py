"""Reliability under real faults (issues 5 and 14): prints the README's summary table.

Scenarios, each against real worker processes, PostgreSQL and Redis:
- SIGKILL a worker mid-stream (repeatedly, while 2 workers drain the load);
- rolling deploys: SIGTERM the worker running a turn (``worker_handover_s``), replace it, and
  how long the turn took to go on elsewhere and the worker to exit;
- SIGKILL the process running a blocking ``save_messages`` turn;
- stop Redis (broker and streams) under load, start it again empty (and how long the agents
  took to resume after it came back);
- Redis refusing writes under load (past its ``maxmemory`` under ``noeviction``), then taking
  them again (how long the agents took to resume, and whether a worker exited);
- Redis failing over under load: the replica promoted, the old primary demoted (it keeps its
  connections and answers READONLY), the name clients use moved to the new primary;
- stop PostgreSQL while submissions arrive, start it again;
- PostgreSQL failing over under load to a server that refuses writes, then writable again
  with the sessions made meanwhile still read-only;
- a model that stalls (``stall_timeout_s``), finished by continuations;
- SIGSTOP a worker for 3x the lease TTL, mid-stream and in the window before its final write
  (a zombie), then SIGCONT it;
- cut a worker from PostgreSQL alone, and from Redis alone (a TCP proxy that holds bytes);
- workers whose clocks are 60 s ahead and 60 s behind (libfaketime), and how long the
  orphaned turns of a killed fast-clock worker waited;
- SIGKILL the only worker while a workflow step waits on its turn (how long the chain took);
- scheduled prompts fired by beat, then beat SIGKILLed and Redis restarted empty before any
  worker took the fires (each occurrence must still be fired, once);
- all of them mixed (``mixed``): three workers on three clocks, each through proxies of its
  own; rounds of one or two faults at once (pause, kill, cut from PostgreSQL or Redis, Redis
  restarted empty, PostgreSQL failed over), chosen by a seed the report prints (``--seed``
  replays it).
Every submission must end ``completed`` (or with a §9 error); nothing lost, no user message
stored twice, no two turns of one agent overlapping (a journal file no fault touches), FIFO
kept, no event of a stale attempt in any stream, and every completed turn's stream rebuilding
its stored reply exactly.

    .venv/bin/python -m bench.reliability            # the docs' figures (~9 min, 2 cores)
    .venv/bin/python -m bench.reliability --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import datetime
from functools import partial
from typing import Any

import redis

from bench.services import scratch_database, scratch_namespace
from tests.apps.agents import Recorder, Staller, read_events
from tests.apps.scheduled_agents import Reporter, make_due
from tests.support.builders import directive, user
from tests.support.faults import (
    HEADER,
    Report,
    check,
    kill_workers_while_running,
    record_kill,
    submit_load,
    unfinished,
)
from tests.support.fencing_faults import (
    Load,
    busy_worker,
    clock_skew,
    open_calls,
    partition,
    skewed,
    zombies,
)
from tests.support.fencing_faults import workers as fencing_workers
from tests.support.nemesis import nemesis
from tests.support.pg_failover import read_only
from tests.support.processes import (
    ROOT,
    WorkerProcess,
    beat_processes,
    private_postgres,
    private_redis,
    worker_processes,
)
from tests.support.proxy import proxy_to
from tests.support.redis_failover import failover_pair
from think_jobs import StorageUnavailableError, Think, ThinkJobs
from think_jobs.messages import message_text
from think_jobs.testing import wait_until

APP = "tests.apps.agents:jobs"
WORKFLOW_APP = "tests.apps.workflow_agents:jobs"
SCHEDULE_APP = "tests.apps.scheduled_agents:jobs"
FAST = {"THINK_JOBS_LEASE_TTL_S": "1.5", "THINK_JOBS_SWEEP_INTERVAL_S": "0.5"}


@contextmanager
def environment(**overrides: str) -> Iterator[tuple[ThinkJobs, dict[str, str]]]:
    """A scratch PostgreSQL database and Redis namespace, and a journal file; yields (jobs,
    worker env)."""
    handle, journal = tempfile.mkstemp(prefix="tj-journal-", suffix=".jsonl")
    os.close(handle)
    with scratch_database("postgres") as url, scratch_namespace() as namespace:
        env = {**namespace.env(url), **FAST, "TJ_TEST_JOURNAL": journal, **overrides}
        os.environ.update(env)  # the recorder and this process's jobs read the same settings
        settings = {k: v for k, v in env.items() if k.startswith("THINK_JOBS_")}
        options: dict[str, Any] = {
            k.removeprefix("THINK_JOBS_").lower(): v for k, v in settings.items()
        }
        jobs = ThinkJobs(**options)
        try:
            yield jobs, env
        finally:
            jobs.close()
            for key in env:
                os.environ.pop(key, None)
            os.unlink(journal)


def worker_kills(scale: int) -> Report:
    with environment() as (jobs, env):
        admitted = submit_load(jobs, agents=10, per_agent=2 * scale, words=12, delay_s=0.01)

        def spawn() -> WorkerProcess:
            return WorkerProcess(env, app=APP, concurrency=2, pool="threads")

        workers = [spawn(), spawn()]
        for process in workers:
            process.wait_ready()
        try:
            kills = kill_workers_while_running(
                jobs, env, admitted, kills=2 * scale, spawn=spawn, workers=workers
            )
            wait_until(lambda: unfinished(jobs, admitted) == 0, 300)
        finally:
            for process in workers:
                process.stop()
        return check(jobs, admitted, Report("SIGKILL worker mid-stream", faults=kills))


def deploys(scale: int) -> Report:
    """``scale`` rolling deploys under load: a new worker starts, then the one running a turn
    is told to stop (SIGTERM, ``worker_handover_s`` 0.5 s)."""
    with environment(THINK_JOBS_WORKER_HANDOVER_S="0.5") as (jobs, env):
        admitted = submit_load(jobs, agents=6, per_agent=scale, words=100, delay_s=0.03)
        workers = [WorkerProcess(env, app=APP, concurrency=2, pool="threads") for _ in "ab"]
        continued: list[float] = []
        exits: list[tuple[float, int]] = []
        try:
            for process in workers:
                process.wait_ready()
            for _ in range(scale):
                workers.append(WorkerProcess(env, app=APP, concurrency=2, pool="threads"))
                workers[-1].wait_ready()  # the new one first, as a rolling deploy does
                stopping = busy_worker(jobs, workers, lambda call: call["chunks"] >= 5, admitted)
                if stopping is None:
                    break
                continued.extend(_deploy(jobs, stopping, exits, admitted))
                workers.remove(stopping)
            wait_until(lambda: unfinished(jobs, admitted) == 0, 300)
        finally:
            for process in workers:
                process.stop()
        report = check(jobs, admitted, Report("SIGTERM mid-stream, handed over", len(exits)))
    codes = sorted({code for _, code in exits})
    report.problems.append(
        f"{len(continued)} handed-over turns went on {_spread(continued)} after SIGTERM; the "
        f"stopping workers exited {_spread([s for s, _ in exits])} after it (exit codes {codes})"
    )
    return report


def _deploy(
    jobs: ThinkJobs,
    stopping: WorkerProcess,
    exits: list[tuple[float, int]],
    admitted: dict[str, list[tuple[str, str]]],
) -> list[float]:
    """SIGTERM ``stopping``; seconds until its exit, and until another worker started a
    model call of each turn it handed over (a turn it ran to its end first counts none)."""
    pid = stopping.process.pid
    labels = {call["label"] for call in open_calls(jobs) if call["pid"] == pid}
    ids = {label: sid for entries in admitted.values() for label, sid in entries}
    marker, sent = len(read_events(jobs)), time.monotonic()
    os.killpg(pid, signal.SIGTERM)
    stopping.process.wait(120)
    exits.append((time.monotonic() - sent, stopping.process.returncode))
    stopping.stop()
    went_on: dict[str, float] = {}

    def settled(label: str) -> bool:  # went on elsewhere, or ended by the stopping worker
        if label in went_on:
            return True
        agent = jobs.get_agent(Recorder, label.split("#")[0])
        found = agent.inspect_submission(ids[label])
        return found is not None and found.status == "completed"

    def all_settled() -> bool:
        for e in read_events(jobs):
            if e["tick"] > marker and e["what"] == "start" and e["label"] in labels:
                went_on.setdefault(e["label"], time.monotonic() - sent)
        return all(settled(label) for label in labels)

    wait_until(all_settled, 120, interval_s=0.01)
    return list(went_on.values())


CALLER = """
import json
from tests.apps.agents import jobs, Recorder
text = " ".join(f"w{{i}}" for i in range(400))
spec = json.dumps({{"label": "{label}", "text": text, "delay_s": 0.01}})
jobs.get_agent(Recorder, "{agent}").save_messages(
    [{{"id": "m-{label}", "role": "user", "parts": [{{"type": "text", "text": spec}}]}}])
"""


def caller_kills(count: int) -> Report:
    with environment() as (jobs, env):
        admitted: dict[str, list[tuple[str, str]]] = {}
        for n in range(count):
            agent, label = f"caller-{n}", f"caller-{n}#0"
            admitted[agent] = [(label, _run_and_kill_caller(jobs, env, agent, label))]
        with worker_processes(env, count=1, concurrency=2, app=APP):
            wait_until(lambda: all(_blocking_done(jobs, name) for name in admitted), 120)
        report = Report("SIGKILL blocking caller", faults=count)
        return _check_blocking(jobs, admitted, report)


def _run_and_kill_caller(jobs: ThinkJobs, env: dict[str, str], agent: str, label: str) -> str:
    code = CALLER.format(label=label, agent=agent)
    caller = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, env={**os.environ, **env}, start_new_session=True
    )
    address = f"Recorder:{agent}"
    wait_until(lambda: _deltas(jobs, address) >= 10, 60)
    os.killpg(caller.pid, signal.SIGKILL)
    caller.wait(10)
    return label


def _deltas(jobs: ThinkJobs, address: str) -> int:
    keys = list(jobs.redis.scan_iter(f"{jobs.keys.prefix}:stream:{address}:*"))
    return sum(1 for key in keys for raw in jobs.redis.lrange(key, 0, -1) if b"text-delta" in raw)


def _blocking_done(jobs: ThinkJobs, name: str) -> bool:
    messages = jobs.get_agent(Recorder, name).get_messages()
    return len(messages) == 2 and messages[-1].role == "assistant"


def _check_blocking(
    jobs: ThinkJobs, admitted: dict[str, list[tuple[str, str]]], report: Report
) -> Report:
    for name, entries in admitted.items():
        ids = [m.id for m in jobs.get_agent(Recorder, name).get_messages() if m.role == "user"]
        report.submissions += 1
        report.duplicated += ids.count(f"m-{entries[0][0]}") > 1
        report.completed += _blocking_done(jobs, name)
        report.lost += not _blocking_done(jobs, name)
    return report


def redis_outage(scale: int) -> Report:
    with private_redis() as server, environment(THINK_JOBS_REDIS_URL=server.url) as (jobs, env):

        def outage() -> None:
            server.stop()
            time.sleep(2.0)  # the outage itself
            server.start()

        name, after = "Redis stopped 2 s, restarted empty", "Redis came back (sweep 0.5 s)"
        return _faults_under_load(jobs, env, scale, outage, name, after, words=6, delay_s=0.005)


def redis_full(scale: int) -> Report:
    """Redis past its ``maxmemory`` (``noeviction``) for 2 s, several times under load: every
    write refused, on live connections (stream appends, drains, kombu's bookkeeping)."""
    with private_redis() as server, environment(THINK_JOBS_REDIS_URL=server.url) as (jobs, env):
        client = redis.Redis.from_url(server.url)
        client.config_set("maxmemory-policy", "noeviction")

        def full() -> None:
            client.config_set("maxmemory", 1)
            time.sleep(2.0)  # the fault itself
            client.config_set("maxmemory", 0)

        try:
            name, after = "Redis refusing writes 2 s (maxmemory)", "Redis took writes again"
            return _faults_under_load(jobs, env, scale, full, name, after)
        finally:
            client.close()


def redis_failover(scale: int) -> Report:
    """Fail Redis over (and back, and over...) several times under load."""
    with failover_pair() as pair, environment(THINK_JOBS_REDIS_URL=pair.url) as (jobs, env):
        name, after = "Redis failed over", "a failover"
        return _faults_under_load(jobs, env, scale, pair.fail_over, name, after)


def _faults_under_load(
    jobs: ThinkJobs,
    env: dict[str, str],
    scale: int,
    fault: Callable[[], None],
    name: str,
    after: str,
    *,
    words: int = 12,
    delay_s: float = 0.01,
) -> Report:
    """Five agents' load drained by two workers; ``fault()`` (over when it returns) injected
    once 20 %, 35 %, 50 %... of it is done, each time followed by how long an idle agent's
    turn took to start; then every submission judged, and whether a worker exited."""
    admitted = submit_load(jobs, agents=5, per_agent=4 * scale, words=words, delay_s=delay_s)
    waits = []
    with worker_processes(env, count=2, concurrency=2, app=APP) as workers:
        for injected in range(max(1, scale // 2)):
            share = 0.8 - 0.15 * injected

            def drained_to(s: float = share) -> bool:
                return unfinished(jobs, admitted) < 4 * 5 * scale * s

            wait_until(drained_to, 120)
            fault()
            waits.append(_probe_wait(jobs, f"probe-{injected}"))
        wait_until(lambda: unfinished(jobs, admitted) == 0, 300)
        exited = sum(process.process.poll() is not None for process in workers)
    report = check(jobs, admitted, Report(name, faults=len(waits)))
    report.problems.append(
        f"agents resumed {_spread(waits)} after {after}; workers exited: {exited} of 2"
    )
    return report


def _probe_wait(jobs: ThinkJobs, name: str) -> float:
    """Submit to an idle agent now; seconds until its turn starts (it needs a broker message,
    or the sweeper, to reach a worker)."""
    sent = time.monotonic()
    jobs.get_agent(Recorder, name).submit_messages([directive(label=name, text="probe")])
    wait_until(lambda: any(e.get("label") == name for e in read_events(jobs)), 120, interval_s=0.01)
    return time.monotonic() - sent


def _resumed_after(jobs: ThinkJobs, marker: int, since: float, *, pid: int) -> float:
    """Seconds (this process's clock, from ``since``) until a model call not of ``pid`` starts
    after journal line ``marker``: the journal's order, not the workers' clocks."""

    def started() -> bool:
        return any(
            e["tick"] > marker and e["what"] == "start" and e["pid"] != pid
            for e in read_events(jobs)
        )

    wait_until(started, 120, interval_s=0.01)
    return time.monotonic() - since


def _spread(values: list[float]) -> str:
    if not values:
        return "n/a"
    low, high = min(values), max(values)
    return (
        f"{low:.2f} s"
        if len(values) == 1
        else f"{low:.2f} to {high:.2f} s (median {statistics.median(values):.2f} s)"
    )


def database_outage(scale: int) -> Report:
    with (
        private_postgres() as server,
        environment(THINK_JOBS_DATABASE_URL=server.url) as (jobs, env),
    ):
        jobs.migrate()
        agent = jobs.get_agent(Recorder, "db-outage")
        accepted: list[str] = []
        refused = 0
        with worker_processes(env, count=1, concurrency=2, app=APP):
            for phase in ("before", "during", "after"):
                if phase == "during":
                    server.stop()
                refused += _submit_some(agent, phase, 5 * scale, accepted)
                if phase == "during":
                    server.start()
            wait_until(lambda: _all_terminal(agent, accepted), 300)
            report = Report("PostgreSQL stopped during submits", faults=1)
            report.submissions = len(accepted)
            report.completed = sum(_status(agent, s) == "completed" for s in accepted)
            report.lost = len(accepted) - report.completed
            user_ids = [m.id for m in agent.get_messages() if m.role == "user"]
            report.duplicated = len(user_ids) - len(set(user_ids))
            report.problems.append(f"{refused} submissions refused with StorageUnavailableError")
        return report


def database_failover(scale: int) -> Report:
    """PostgreSQL read-only for 2 s (its sessions ended, as a demotion ends them), several
    times under load; writable again, the sessions made meanwhile stay read-only."""
    with environment() as (jobs, env):
        database = env["THINK_JOBS_DATABASE_URL"].rsplit("/", 1)[1]

        def failover() -> None:
            with read_only(database):
                time.sleep(2.0)  # the fault itself

        name, after = "PostgreSQL read-only 2 s (failover)", "it took writes"
        return _faults_under_load(jobs, env, scale, failover, name, after)


def _submit_some(agent: Recorder, phase: str, count: int, accepted: list[str]) -> int:
    refused = 0
    for n in range(count):
        try:
            result = agent.submit_messages([user(f'{{"label": "{phase}-{n}"}}', f"m-{phase}-{n}")])
            accepted.append(result.submission_id)
        except StorageUnavailableError:
            refused += 1
    return refused


def _status(agent: Think, submission_id: str) -> str:
    found = agent.inspect_submission(submission_id)
    return found.status.value if found else "missing"


def _all_terminal(agent: Think, ids: list[str]) -> bool:
    return all(_status(agent, s) in ("completed", "error", "aborted") for s in ids)


def stalls(scale: int) -> Report:
    with environment() as (jobs, env):
        agents = [jobs.get_agent(Staller, f"staller-{n}") for n in range(5)]
        ids = [
            (agent, agent.submit_messages([user("go")]).submission_id)
            for agent in agents
            for _ in range(scale)
        ]
        with worker_processes(env, count=2, concurrency=2, app=APP):
            wait_until(lambda: all(_status(a, s) == "completed" for a, s in ids), 300)
        report = Report("model stalls (stall_timeout_s=0.5)", faults=len(ids))
        for agent, submission_id in ids:
            report.submissions += 1
            report.completed += _status(agent, submission_id) == "completed"
        replies = [m for a in agents for m in a.get_messages() if m.role == "assistant"]
        report.lost = sum(1 for m in replies if "and the rest." not in str(m.parts))
        return report


def zombie(scale: int, *, before_final_write: bool) -> Report:
    with environment() as (jobs, env):
        load = (
            Load(agents=6, per_agent=scale, words=12, delay_s=0.01, hold_s=0.5)
            if before_final_write
            else Load(agents=6, per_agent=scale, words=40, delay_s=0.03)
        )
        return zombies(jobs, env, pauses=scale, load=load, before_final_write=before_final_write)


def cut_off(scale: int, *, server: str) -> Report:
    port = 5432 if server == "postgres" else _redis_port()
    with environment() as (jobs, env), proxy_to(port) as proxy:
        load = Load(agents=6, per_agent=scale, words=40, delay_s=0.03)
        cuts = max(1, scale // 2)
        return partition(jobs, env, server=server, proxy=proxy, cuts=cuts, cut_s=6, load=load)


def mixed(scale: int, *, seed: int | None = None) -> Report:
    """Faults of every kind mixed, one or two at once, on three workers (``tests/support/
    nemesis.py``); the seed is printed so that a run can be replayed with ``--seed``."""
    chosen = seed if seed is not None else random.randrange(10**6)
    with private_redis() as server, environment(THINK_JOBS_REDIS_URL=server.url) as (jobs, env):
        load = Load(agents=8, per_agent=2 * scale, words=40, delay_s=0.03, hold_s=0.3)
        report, _ = nemesis(
            jobs, env, server, load=load, rounds=2 * scale, seed=chosen, arrivals=4 * scale
        )
        return report


def _redis_port() -> int:
    from bench.services import REDIS_URL

    return int(REDIS_URL.split(":")[2].split("/")[0])


def skew(scale: int) -> Report:
    with environment() as (jobs, env):
        load = Load(agents=12, per_agent=scale, words=6, delay_s=0.01)
        report = clock_skew(jobs, env, load=load)
    report.problems.append(f"orphans of a killed +60 s worker waited {_orphan_wait():.2f} s")
    return report


def _orphan_wait() -> float:
    """SIGKILL a worker 60 s ahead mid-turn; seconds until another worker starts its turn
    (the lease TTL is 1.5 s)."""
    with environment() as (jobs, env):
        admitted = submit_load(jobs, agents=1, per_agent=1, words=80, delay_s=0.05)
        with fencing_workers([env]) as (slow,):
            slow.process.send_signal(signal.SIGSTOP)  # only the fast one takes the turn
            with fencing_workers([skewed(env, "+60s")]) as (fast,):
                busy_worker(jobs, [fast], lambda call: call["chunks"] >= 3, admitted)
                record_kill(jobs, fast.process.pid)
                marker, killed_at = len(read_events(jobs)), time.monotonic()
                fast.kill()
                slow.process.send_signal(signal.SIGCONT)
                waited = _resumed_after(jobs, marker, killed_at, pid=fast.process.pid)
            wait_until(lambda: unfinished(jobs, admitted) == 0, 120)
        return waited


def workflow_kill(scale: int) -> Report:
    """The only worker SIGKILLed while a chain's first step waits on its turn: the chain goes
    on after the turn's recovery (lease TTL + a sweep), not the broker's visibility timeout."""
    waits = []
    report = Report("worker killed under a waiting workflow step", faults=0)
    for _ in range(max(1, scale // 3)):
        waits.append(_one_workflow_kill(report))
    report.problems.append(
        f"chains went on {_spread(waits)} after a replacement worker started (lease TTL 1.5 s "
        "+ sweep 0.5 s)"
    )
    return report


def _one_workflow_kill(report: Report) -> float:
    from celery import chain

    with environment() as (jobs, env):
        label = f"step-{uuid.uuid4().hex[:6]}"
        text = " ".join(f"w{i}" for i in range(60))
        flow = chain(
            jobs.turn.s(
                "Recorder", "wf", messages=[directive(label=label, text=text, delay_s=0.05)]
            ),
            jobs.celery.signature("tests.post", kwargs={"channel": "#ops"}),
        )
        with fencing_workers([env], app=WORKFLOW_APP) as (only,):
            result = flow.apply_async()
            agent = jobs.get_agent(Recorder, "wf")
            wait_until(lambda: any(c["chunks"] >= 5 for c in open_calls(jobs)), 120)
            record_kill(jobs, only.process.pid)
            only.kill()
        with fencing_workers([env], app=WORKFLOW_APP):
            ready_at = time.monotonic()  # from the replacement worker's start
            final = result.get(timeout=300)
            waited = time.monotonic() - ready_at
        [reply] = [m for m in agent.get_messages() if m.role == "assistant"]
        report.faults += 1
        report.submissions += 1
        posted = final.get("posted") == message_text(reply) and message_text(reply).endswith(text)
        report.completed += posted
        report.duplicated += len(agent.list_submissions()) != 1
        report.lost += not posted
        return waited


def lost_fires(scale: int) -> Report:
    """Rounds of: every agent's prompt made due, beat fires them all while no worker runs,
    beat is SIGKILLed and Redis restarted empty (every fire message gone). Then a new beat and
    two workers: each occurrence must end with exactly one completed submission."""
    fast = {
        "THINK_JOBS_BEAT_TICK_INTERVAL_S": "0.2",
        "THINK_JOBS_SCHEDULE_FIRE_TIMEOUT_S": "2",
    }
    report = Report("fires lost: beat SIGKILLed, Redis restarted empty")
    with (
        private_redis() as server,
        environment(**fast, THINK_JOBS_REDIS_URL=server.url) as (
            jobs,
            env,
        ),
    ):
        jobs.register(Reporter)
        agents = [jobs.get_agent(Reporter, f"sched-{i}") for i in range(5 * scale)]
        for agent in agents:
            agent.start()
        occurrences: list[tuple[Think, datetime]] = []
        for round_ in range(max(1, scale // 2)):
            dues = [(agent, make_due(agent, "digest", hours_back=round_)) for agent in agents]
            with beat_processes(env, app=SCHEDULE_APP) as [beat]:
                lines = {f"digest of {a.address} for {due.isoformat()}" for a, due in dues}
                wait_until(lambda b=beat, w=lines: w <= set(b.fired()), 120)  # type: ignore[misc]
                beat.kill()
            server.stop()
            server.start()
            report.faults += 2
            occurrences += dues
        with (
            beat_processes(env, app=SCHEDULE_APP),
            worker_processes(env, app=SCHEDULE_APP),
            suppress(TimeoutError),  # what is still missing then is counted as lost
        ):
            wait_until(lambda: _fired_once(occurrences, report, final=False), 120)
        _fired_once(occurrences, report, final=True)
    return report


def _fired_once(occurrences: list[tuple[Think, datetime]], report: Report, *, final: bool) -> bool:
    """Whether every occurrence has a completed submission; on ``final``, counts them into
    ``report`` (none: lost; more than one: duplicated)."""
    found: dict[str, list[str]] = {}
    for agent in {agent.address: agent for agent, _ in occurrences}.values():
        for submission in agent.list_submissions(limit=1000):
            when = (submission.metadata or {}).get("scheduled_for")
            found.setdefault(f"{agent.address} {when}", []).append(submission.status)
    statuses = [found.get(f"{agent.address} {due.isoformat()}", []) for agent, due in occurrences]
    if final:
        report.submissions = len(occurrences)
        report.completed = sum(s == ["completed"] for s in statuses)
        report.lost = sum(not s for s in statuses)
        report.duplicated = sum(len(s) > 1 for s in statuses)
    return all(s and all(status == "completed" for status in s) for s in statuses)


SCENARIOS: dict[str, Callable[[int], Report]] = {
    "worker-kills": worker_kills,
    "caller-kills": lambda scale: caller_kills(max(2, scale // 2)),
    "deploys": deploys,
    "redis-outage": redis_outage,
    "redis-full": redis_full,
    "redis-failover": redis_failover,
    "database-outage": database_outage,
    "database-failover": database_failover,
    "stalls": stalls,
    "zombie-mid-stream": lambda scale: zombie(scale, before_final_write=False),
    "zombie-before-final-write": lambda scale: zombie(scale, before_final_write=True),
    "cut-from-postgres": lambda scale: cut_off(scale, server="postgres"),
    "cut-from-redis": lambda scale: cut_off(scale, server="redis"),
    "clock-skew": skew,
    "workflow-kill": workflow_kill,
    "lost-fires": lost_fires,
    "mixed": mixed,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small load, few faults")
    parser.add_argument("--only", choices=sorted(SCENARIOS), action="append")
    parser.add_argument("--seed", type=int, help="the mixed scenario's schedule (replay a run)")
    args = parser.parse_args()
    scale = 2 if args.quick else 10
    scenarios: dict[str, Callable[[int], Report]] = {
        **SCENARIOS,
        "mixed": partial(mixed, seed=args.seed),
    }
    reports = [scenarios[name](scale) for name in args.only or SCENARIOS]
    print(HEADER)
    for report in reports:
        print(report.row())
    for report in reports:
        for problem in report.problems:
            print(f"- {report.scenario}: {problem}")


if __name__ == "__main__":
    main()
