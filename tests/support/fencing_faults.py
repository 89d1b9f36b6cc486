"""Fault scenarios of fenced execution (issue 14), shared by the tests and
``bench/reliability.py``: real worker processes paused (SIGSTOP) past the lease TTL, cut from
PostgreSQL or from Redis alone (a TCP proxy that holds bytes), running with skewed clocks
(libfaketime), Redis restarted empty under load, and a workflow step waiting on a turn while
the only worker is killed. Each returns a ``Report`` judged from outside: the journal (a file
no fault touches), the public API and the streams a client reads.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.apps.agents import Journal, Recorder, read_events
from tests.support.faults import Report, check, submit_load, unfinished, zombie_tails
from tests.support.processes import WorkerProcess
from tests.support.proxy import Proxy
from think_jobs import ThinkJobs
from think_jobs.testing import wait_until

APP = "tests.apps.agents:jobs"


_FAKETIME_SLEEP = Path(__file__).parent / "faketime_sleep"


def _faketime() -> str:
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    if not found:
        raise RuntimeError("libfaketime is not installed (scripts/ensure-services faketime)")
    return str(found[0])


Admitted = dict[str, list[tuple[str, str]]]


@dataclass(frozen=True)
class Load:
    agents: int = 6
    per_agent: int = 5
    words: int = 30
    delay_s: float = 0.03
    hold_s: float = 0.0


def submit(jobs: ThinkJobs, load: Load) -> Admitted:
    return submit_load(
        jobs,
        agents=load.agents,
        per_agent=load.per_agent,
        words=load.words,
        delay_s=load.delay_s,
        **({"hold_s": load.hold_s} if load.hold_s else {}),
    )


@contextmanager
def workers(envs: list[dict[str, str]], *, app: str = APP) -> Iterator[list[WorkerProcess]]:
    processes = [WorkerProcess(env, app=app, concurrency=2, pool="threads") for env in envs]
    try:
        for process in processes:
            process.wait_ready(60)
        yield processes
    finally:
        for process in processes:
            process.process.send_signal(signal.SIGCONT)
            process.stop()


def finish(
    jobs: ThinkJobs, admitted: Admitted, report: Report, cancelled: Collection[str] = ()
) -> Report:
    """Judge once every submission has ended and every model call of a live process has too:
    a worker resumed after the load finished ends its stale call at its next chunk, and a call
    judged before its end is journalled would count as running for ever."""
    wait_until(lambda: unfinished(jobs, admitted) == 0, 240, interval_s=0.2)
    wait_until(lambda: not any(_live(c["pid"]) for c in open_calls(jobs)), 60, interval_s=0.05)
    return check(jobs, admitted, report, cancelled)


def _live(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and _state(pid) != "Z"


# -- what is running where (from the journal) --------------------------------------------------


_FAULTS = frozenset({"stopping", "stopped", "resumed", "cut", "healed"})


def open_calls(jobs: ThinkJobs) -> list[dict[str, Any]]:
    """Model calls started and not ended, with the chunks each yielded so far."""
    calls: dict[tuple[str, str, int], dict[str, Any]] = {}
    for event in read_events(jobs):
        key = (event.get("agent", ""), event.get("label", ""), event.get("pid", 0))
        if event["what"] == "start":
            calls[key] = {**event, "chunks": 0, "holding": False}
        elif event["what"] == "chunk" and key in calls:
            calls[key]["chunks"] += 1
        elif event["what"] == "holding" and key in calls:
            calls[key]["holding"] = True
        elif event["what"] == "end":
            calls.pop(key, None)
    return list(calls.values())


def busy_worker(
    jobs: ThinkJobs,
    candidates: list[WorkerProcess],
    ready: Callable[[dict[str, Any]], bool],
    admitted: Admitted,
) -> WorkerProcess | None:
    """Wait for a worker among ``candidates`` running a model call for which ``ready`` holds,
    started after the last fault; None once the whole load has finished."""
    pids = {process.process.pid: process for process in candidates}
    since = max((e["tick"] for e in read_events(jobs) if e["what"] in _FAULTS), default=0)

    def fresh(call: dict[str, Any]) -> bool:
        return call["pid"] in pids and call["tick"] > since and ready(call)

    def found() -> WorkerProcess | bool:
        hit = next((pids[c["pid"]] for c in open_calls(jobs) if fresh(c)), None)
        return hit if hit is not None else unfinished(jobs, admitted) == 0

    worker = wait_until(found, 120, interval_s=0.02)
    return worker if isinstance(worker, WorkerProcess) else None


# -- the faults --------------------------------------------------------------------------------


def pause(jobs: ThinkJobs, process: WorkerProcess, seconds: float, *, lease_ttl_s: float) -> None:
    """SIGSTOP the worker for ``seconds`` (longer than the lease TTL), then SIGCONT it; both
    go in the journal: ``stopping`` just before the signal and ``stopped`` once the process
    is frozen (with the lease TTL it outlasts), so the freeze began between the two however
    slowly this process runs; ``resumed`` before it runs again."""
    pid = process.process.pid
    journal = Journal(jobs)
    journal.write({"what": "stopping", "pid": pid, "t": time.time()})
    os.killpg(pid, signal.SIGSTOP)
    wait_until(lambda: _state(pid) == "T", 10, interval_s=0.005)
    journal.write({"what": "stopped", "pid": pid, "t": time.time(), "lease_ttl_s": lease_ttl_s})
    time.sleep(seconds)  # the fault itself: the process is frozen this long
    journal.write({"what": "resumed", "pid": pid, "t": time.time()})
    os.killpg(pid, signal.SIGCONT)


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def zombies(
    jobs: ThinkJobs, env: dict[str, str], *, pauses: int, load: Load, before_final_write: bool
) -> Report:
    """Two workers; ``pauses`` times, freeze the one running a turn (mid-stream, or in the
    window after its model's last chunk) for 3 times the lease TTL, then resume it."""
    ttl_s = float(env["THINK_JOBS_LEASE_TTL_S"])
    admitted = submit(jobs, load)

    def ready(call: dict[str, Any]) -> bool:
        return bool(call["holding"]) if before_final_write else call["chunks"] >= 5

    injected = 0
    with workers([env, env]) as processes:
        for _ in range(pauses):
            target = busy_worker(jobs, processes, ready, admitted)
            if target is None:
                break
            pause(jobs, target, 3 * ttl_s, lease_ttl_s=ttl_s)
            injected += 1
        name = "SIGSTOP before the final write" if before_final_write else "SIGSTOP mid-stream"
        report = finish(jobs, admitted, Report(f"{name} (3x lease TTL)", faults=injected))
    return _judge_tails(jobs, report)


def _judge_tails(jobs: ThinkJobs, report: Report) -> Report:
    tails = zombie_tails(read_events(jobs))
    long_tails = [t for t in tails if t > 1]
    report.stale_writes += len(long_tails)
    if long_tails:
        report.problems.append(f"resumed attempts went on for {long_tails} chunks")
    return report


def partition(
    jobs: ThinkJobs,
    env: dict[str, str],
    *,
    server: str,
    proxy: Proxy,
    cuts: int,
    cut_s: float,
    load: Load,
) -> Report:
    """Two workers, one of them reaching ``server`` (postgres or redis) through ``proxy``;
    ``cuts`` times, while it runs a turn, cut it from that server alone for ``cut_s``."""
    admitted = submit(jobs, load)
    with workers([through(env, server, proxy), env]) as (cut_off, _):
        injected = 0
        for _ in range(cuts):
            if busy_worker(jobs, [cut_off], lambda call: call["chunks"] >= 3, admitted) is None:
                break
            _cut(jobs, proxy, cut_s)
            injected += 1
        scenario = (
            f"{'PostgreSQL' if server == 'postgres' else 'Redis'} cut from a worker {cut_s:g} s"
        )
        return finish(jobs, admitted, Report(scenario, faults=injected))


def _cut(jobs: ThinkJobs, proxy: Proxy, cut_s: float) -> None:
    journal = Journal(jobs)
    proxy.cut()
    journal.write({"what": "cut", "t": time.time()})
    time.sleep(cut_s)  # the partition itself
    journal.write({"what": "healed", "t": time.time()})
    proxy.heal()


def through(env: dict[str, str], server: str, proxy: Proxy) -> dict[str, str]:
    """``env`` with ``server`` (``postgres``, or ``redis`` and the broker) through ``proxy``."""
    if server == "postgres":
        url = env["THINK_JOBS_DATABASE_URL"]
        host = url.rpartition("@")[2].partition("/")[0]
        return {**env, "THINK_JOBS_DATABASE_URL": url.replace(host, f"127.0.0.1:{proxy.port}", 1)}
    url = env["THINK_JOBS_REDIS_URL"]
    database = url.rsplit("/", 1)[1]
    through = f"redis://127.0.0.1:{proxy.port}/{database}"
    return {**env, "THINK_JOBS_REDIS_URL": through, "THINK_JOBS_BROKER_URL": through}


def skewed(env: dict[str, str], offset: str) -> dict[str, str]:
    """A worker whose clock is ``offset`` off (libfaketime, e.g. ``+60s``); its ``time.sleep``
    waits in ``select`` (``faketime_sleep/sitecustomize.py`` says why)."""
    inherited = env.get("PYTHONPATH", os.environ.get("PYTHONPATH"))
    path = [str(_FAKETIME_SLEEP), *filter(None, [inherited])]
    return {
        **env,
        "PYTHONPATH": os.pathsep.join(path),
        "LD_PRELOAD": _faketime(),
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


def clock_skew(jobs: ThinkJobs, env: dict[str, str], *, load: Load) -> Report:
    """Two workers, one 60 s ahead and one 60 s behind the database's clock (and this
    process's); the turns' lives must read in order by the database's timestamps too."""
    admitted = submit(jobs, load)
    with workers([skewed(env, "+60s"), skewed(env, "-60s")]):
        report = finish(jobs, admitted, Report("clocks +60 s and -60 s", faults=2))
    for name, entries in admitted.items():
        agent = jobs.get_agent(Recorder, name)
        for label, submission_id in entries:
            found = agent.inspect_submission(submission_id)
            if (
                found is not None
                and found.started_at is not None
                and found.started_at < found.created_at
            ):
                report.order_violations += 1
                report.problems.append(f"{label}: started_at before created_at")
    return report
