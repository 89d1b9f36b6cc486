"""Reliability under real faults (issue 5): prints the README's summary table.

Scenarios, each against real worker processes, PostgreSQL and Redis:
- SIGKILL a worker mid-stream (repeatedly, while 2 workers drain the load);
- SIGKILL the process running a blocking ``save_messages`` turn;
- stop Redis (broker and streams) under load, start it again empty;
- stop PostgreSQL while submissions arrive, start it again;
- a model that stalls (``stall_timeout_s``), finished by continuations.
Every submission must end ``completed`` (or with a §9 error); nothing lost, no user message
stored twice, no two turns of one agent overlapping, FIFO kept.

    .venv/bin/python -m bench.reliability            # the README figures (~1.5 min, 2 cores)
    .venv/bin/python -m bench.reliability --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from bench.services import scratch_database, scratch_namespace
from tests.apps.agents import Recorder, Staller
from tests.support.builders import user
from tests.support.faults import (
    HEADER,
    Report,
    check,
    kill_workers_while_running,
    submit_load,
    unfinished,
)
from tests.support.processes import (
    ROOT,
    WorkerProcess,
    private_postgres,
    private_redis,
    worker_processes,
)
from think_jobs import StorageUnavailableError, ThinkJobs
from think_jobs.testing import wait_until

APP = "tests.apps.agents:jobs"
FAST = {"THINK_JOBS_LEASE_TTL_S": "1.5", "THINK_JOBS_SWEEP_INTERVAL_S": "0.5"}


@contextmanager
def environment(**overrides: str) -> Iterator[tuple[ThinkJobs, dict[str, str]]]:
    """A scratch PostgreSQL database and Redis namespace; yields (jobs, worker env)."""
    with scratch_database("postgres") as url, scratch_namespace() as namespace:
        env = {**namespace.env(url), **FAST, **overrides}
        os.environ.update(env)  # the recorder and this process's jobs read the same settings
        jobs = ThinkJobs(**{k.removeprefix("THINK_JOBS_").lower(): v for k, v in env.items()})
        try:
            yield jobs, env
        finally:
            jobs.close()
            for key in env:
                os.environ.pop(key, None)


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
        env["TJ_TEST_EVENTS_REDIS"] = os.environ["TJ_TEST_EVENTS_REDIS"] = scratch_events_url()
        admitted = submit_load(jobs, agents=5, per_agent=4 * scale, words=6, delay_s=0.005)
        with worker_processes(env, count=2, concurrency=2, app=APP):
            wait_until(lambda: unfinished(jobs, admitted) < 4 * 5 * scale * 0.8, 120)
            server.stop()
            time.sleep(2.0)  # the outage itself
            server.start()
            wait_until(lambda: unfinished(jobs, admitted) == 0, 300)
        os.environ.pop("TJ_TEST_EVENTS_REDIS", None)
        return check(jobs, admitted, Report("Redis stopped 2 s under load", faults=1))


def scratch_events_url() -> str:
    from bench.services import REDIS_URL

    return REDIS_URL


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


def _submit_some(agent: Recorder, phase: str, count: int, accepted: list[str]) -> int:
    refused = 0
    for n in range(count):
        try:
            result = agent.submit_messages([user(f'{{"label": "{phase}-{n}"}}', f"m-{phase}-{n}")])
            accepted.append(result.submission_id)
        except StorageUnavailableError:
            refused += 1
    return refused


def _status(agent: Recorder, submission_id: str) -> str:
    found = agent.inspect_submission(submission_id)
    return found.status.value if found else "missing"


def _all_terminal(agent: Recorder, ids: list[str]) -> bool:
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


SCENARIOS: dict[str, Callable[[int], Report]] = {
    "worker-kills": worker_kills,
    "caller-kills": lambda scale: caller_kills(max(2, scale // 2)),
    "redis-outage": redis_outage,
    "database-outage": database_outage,
    "stalls": stalls,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small load, few faults")
    parser.add_argument("--only", choices=sorted(SCENARIOS), action="append")
    args = parser.parse_args()
    scale = 2 if args.quick else 10
    reports = [SCENARIOS[name](scale) for name in args.only or SCENARIOS]
    print(HEADER)
    for report in reports:
        print(report.row())
    for report in reports:
        for problem in report.problems:
            print(f"- {report.scenario}: {problem}")


if __name__ == "__main__":
    main()
