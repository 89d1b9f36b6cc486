"""Peers: think-jobs side by side with procrastinate, DBOS and Celery on the same work.

The workloads, each peer doing the same work (issue 19's table, and a contended drain):

- FIFO drain: ``--keys`` x ``--jobs`` jobs queued with no worker running, then drained by 2
  worker processes x ``--concurrency``; jobs/s from the first finished job to the last, worker
  CPU time per job (from ready to done), PostgreSQL's CPU time per job over the same drain,
  per-key order and exclusion checked afterwards.
- Contended FIFO drain: the same with ``--hot-keys`` (3) keys, fewer than the 4 slots, so a
  key's next job is queued right behind its running one (where a queue without per-key
  ordering shows it).
- Lone job latency: one worker process; one job enqueued, then waited for, back to back;
  p50 and p99.
- Accepts/s: producer-side enqueues, one at a time, each to a key with nothing queued.

think-jobs runs here, from this virtualenv, with the functions of ``bench.fifo_throughput``,
``bench.turn_overhead`` and ``bench.accept`` (a one-chunk turn of an agent per key; its result
row is the turn's stored reply). Each peer runs in a virtualenv of its own that this script
creates with pinned versions (``bench/.peers/<name>``, git-ignored) and a driver script of
``bench/peer_scripts`` that starts the peer's worker processes and prints its figures as
JSON; its jobs INSERT one result row into PostgreSQL and push one Redis done signal, as the
think-jobs turns do. Each peer gets a fresh database ``peers_<name>`` (dropped after) and
Redis database 13 (flushed before and after; ``PEERS_REDIS_URL`` overrides it).

    .venv/bin/python -m bench.peers [--quick] [--keys 100 --jobs 50] [--json PATH]
    .venv/bin/python -m bench.peers --setup-only      # create/update the peers' virtualenvs
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import redis
import sqlalchemy as sa

from bench import fifo_throughput, measure, report, services
from bench.accept import AcceptBench
from bench.agents import starts_key
from bench.peer_scripts.proc import postgres_cpu_s
from bench.services import Scratch, scratch, worker_processes
from bench.turn_overhead import TurnBench

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "bench" / "peer_scripts"
VENVS = ROOT / "bench" / ".peers"
PEERS_REDIS_URL = os.environ.get("PEERS_REDIS_URL", "redis://127.0.0.1:6379/13")
WORKERS = 2
LATENCY_KEYS = 16
ACCEPT_WARMUP = 20
_COMMON = ("psycopg[binary]==3.3.9", "redis==8.1.0", "psutil==7.2.2")


@dataclass(frozen=True)
class Peer:
    name: str
    label: str  # the table's column header, {version} filled in
    requirements: tuple[str, ...]
    main_package: str

    @property
    def venv(self) -> Path:
        return VENVS / self.name

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def script(self) -> Path:
        return SCRIPTS / f"{self.name}_peer.py"


PEERS = (
    Peer(
        "procrastinate",
        "procrastinate {version} (`lock=`)",
        ("procrastinate==3.10.0", "psycopg-pool==3.3.3", *_COMMON),
        "procrastinate",
    ),
    Peer(
        "dbos",
        "DBOS {version} (partitioned queue, poll 10 ms)",
        ("dbos==3.4.0", "sqlalchemy==2.1.9", *_COMMON),
        "dbos",
    ),
    Peer(
        "celery",
        "Celery {version} + a DB write (no ordering)",
        ("celery[redis]==5.7.0", "kombu==5.7.0", *_COMMON),
        "celery",
    ),
)
BY_NAME = {peer.name: peer for peer in PEERS}


# -- the peers' virtualenvs ------------------------------------------------------------------


def ensure_venv(peer: Peer) -> None:
    """Create ``bench/.peers/<name>`` with the pinned requirements (once: a stamp file holds
    what was installed)."""
    stamp = peer.venv / ".bench-requirements"
    wanted = "\n".join(peer.requirements) + "\n"
    if stamp.exists() and stamp.read_text() == wanted and peer.python.exists():
        return
    base = getattr(sys, "_base_executable", sys.executable)
    print(f"[peers] creating {peer.venv.relative_to(ROOT)} ({base})", flush=True)
    if not peer.python.exists():
        subprocess.run([base, "-m", "venv", str(peer.venv)], check=True)
    pip = [str(peer.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, *peer.requirements], check=True)
    stamp.write_text(wanted)


# -- think-jobs ------------------------------------------------------------------------------


def _fifo(run: Scratch, args: argparse.Namespace, *, keys: int, per_key: int) -> dict[str, Any]:
    """``bench.fifo_throughput``'s think-jobs phase: submissions interleaved over the agents,
    then 2 workers; order checked at start (the model's record) and in the turns table."""
    jobs, count = run.jobs, keys * per_key
    admitted = fifo_throughput.submit_all(jobs, agents=keys, per_agent=per_key)
    pg_before = postgres_cpu_s()  # includes the 2 workers' start (the peers' does not)
    drained = fifo_throughput.drain(
        run, expected=count, concurrency=args.concurrency, timeout_s=120 + count / 5
    )
    pg_cpu = postgres_cpu_s() - pg_before
    unfinished, overlaps = fifo_throughput.table_violations(jobs)
    out_of_order = fifo_throughput.start_order_violations(jobs, admitted)
    with jobs.db.write() as conn:
        conn.execute(sa.text("DELETE FROM think_turns"))
        conn.execute(sa.text("DELETE FROM think_messages"))
    jobs.redis.delete(*(starts_key(jobs, name) for name in admitted))
    return {
        "jobs": count,
        "seconds": drained.seconds,
        "jobs_per_s": drained.rate_per_s,
        "worker_cpu_s": drained.worker_cpu_s,
        "cpu_ms_per_job": drained.cpu_ms_per_unit,
        "postgres_cpu_ms_per_job": pg_cpu * 1000 / count,
        "violations": unfinished + overlaps + out_of_order,
        "verdict": {"unfinished": unfinished, "overlaps": overlaps, "out_of_order": out_of_order},
    }


def _latency(run: Scratch, args: argparse.Namespace) -> dict[str, Any]:
    """``bench.turn_overhead``'s turn: submit, then BLPOP of what ``on_chat_response`` pushes;
    one worker, agents rotating."""
    with worker_processes(run, count=1, concurrency=args.concurrency):
        bench = TurnBench(run, agents=LATENCY_KEYS)
        measure.sample(bench.turn, count=min(10, args.latency_count))  # warm-up
        found = measure.sample(bench.turn, count=args.latency_count)
    return {
        "count": len(found.samples_ms),
        "p50_ms": found.p50,
        "p99_ms": found.p99,
        "mean_ms": sum(found.samples_ms) / len(found.samples_ms),
    }


def _accept(run: Scratch, args: argparse.Namespace) -> dict[str, Any]:
    """``bench.accept``'s ``submit_messages`` to idle agents, no worker running."""
    count = args.accept_count
    bench = AcceptBench(run, agents=count + ACCEPT_WARMUP)
    try:
        measure.sample(lambda index: bench.accept(count + index), count=ACCEPT_WARMUP)
        bench.settle(ACCEPT_WARMUP)
        found = measure.sample(bench.accept, count=count)
        bench.settle(count)
    finally:
        bench.close()
    return {
        "count": count,
        "accepts_per_s": found.rate_per_s,
        "p50_ms": found.p50,
        "p99_ms": found.p99,
    }


def _git_revision() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return done.stdout.strip() or "unknown"


def run_think_jobs(args: argparse.Namespace) -> dict[str, Any]:
    with scratch("postgres") as run:
        found: dict[str, Any] = {
            "peer": "think-jobs",
            "versions": {
                "think-jobs": f"{metadata.version('think-jobs')} ({_git_revision()})",
                "celery": metadata.version("celery"),
                "sqlalchemy": metadata.version("sqlalchemy"),
                "psycopg": metadata.version("psycopg"),
            },
        }
        found["fifo"] = _fifo(run, args, keys=args.keys, per_key=args.jobs)
        if args.hot_keys:
            found["fifo_hot"] = _fifo(run, args, keys=args.hot_keys, per_key=args.hot_jobs)
        found["latency"] = _latency(run, args)
        found["accept"] = _accept(run, args)
    return found


# -- a peer ----------------------------------------------------------------------------------


def _flush_peer_redis() -> None:
    client = redis.Redis.from_url(PEERS_REDIS_URL)
    try:
        client.flushdb()
    finally:
        client.close()


def _peer_db_url(database: str) -> str:
    return f"{services.PG_ADMIN.rsplit('/', 1)[0]}/{database}"


def run_peer(peer: Peer, args: argparse.Namespace) -> dict[str, Any]:
    """The peer's driver on a fresh database and a flushed Redis database."""
    database = f"peers_{peer.name}_{uuid.uuid4().hex[:6]}"
    with services.pg_admin() as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    _flush_peer_redis()
    count = args.keys * args.jobs + args.hot_keys * args.hot_jobs
    command = [
        str(peer.python), str(peer.script), "driver",
        "--db-url", _peer_db_url(database), "--redis-url", PEERS_REDIS_URL,
        "--keys", str(args.keys), "--jobs", str(args.jobs),
        "--hot-keys", str(args.hot_keys), "--hot-jobs", str(args.hot_jobs),
        "--workers", str(WORKERS), "--concurrency", str(args.concurrency),
        "--latency-count", str(args.latency_count), "--accept-count", str(args.accept_count),
        "--timeout-s", str(120 + count / 5),
    ]  # fmt: skip
    try:
        done = subprocess.run(
            command, cwd=SCRIPTS, capture_output=True, text=True, timeout=600 + count / 2
        )
    finally:
        with services.pg_admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        _flush_peer_redis()
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{peer.name} driver failed ({done.returncode}):\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


SECTIONS = ("fifo", "fifo_hot", "latency", "accept")


def combine(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One side's figures over rounds: the median of each number, violations summed."""
    if len(rounds) == 1:
        return rounds[0]
    combined: dict[str, Any] = {"peer": rounds[0]["peer"], "versions": rounds[0]["versions"]}
    for section in SECTIONS:
        if section not in rounds[0]:
            continue
        numbers: dict[str, Any] = {}
        for key, value in rounds[0][section].items():
            values = [found[section][key] for found in rounds]
            if key == "violations":
                numbers[key] = sum(values)
            elif key == "verdict":
                numbers[key] = {k: sum(v[k] for v in values) for k in value}
            else:
                numbers[key] = measure.median(values)
        combined[section] = numbers
    return combined


# -- the table -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    label: str
    path: tuple[str, str]
    better: str  # "higher" or "lower"


ROWS = (
    Row("FIFO drain, jobs/s", ("fifo", "jobs_per_s"), "higher"),
    Row("worker CPU per job (ms)", ("fifo", "cpu_ms_per_job"), "lower"),
    Row("PostgreSQL CPU per job (ms)", ("fifo", "postgres_cpu_ms_per_job"), "lower"),
    Row("contended FIFO drain, jobs/s", ("fifo_hot", "jobs_per_s"), "higher"),
    Row("lone job latency p50 (ms)", ("latency", "p50_ms"), "lower"),
    Row("lone job latency p99 (ms)", ("latency", "p99_ms"), "lower"),
    Row("accepts/s", ("accept", "accepts_per_s"), "higher"),
)


def _value(result: dict[str, Any], path: tuple[str, str]) -> float:
    return float(result[path[0]][path[1]])


def _number(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def column_label(name: str, result: dict[str, Any]) -> str:
    if name == "think-jobs":
        return "think-jobs"
    peer = BY_NAME[name]
    return peer.label.format(version=result["versions"][peer.main_package])


def ratios(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every figure and think-jobs ÷ peer, per row."""
    tj = results.get("think-jobs")
    found = []
    for row in ROWS:
        if any(row.path[0] not in result for result in results.values()):
            continue
        entry: dict[str, Any] = {"workload": row.label, "better": row.better, "values": {}}
        for name, result in results.items():
            value = _value(result, row.path)
            ratio = None if tj is None or value == 0 else _value(tj, row.path) / value
            entry["values"][name] = {"value": value, "think_jobs_ratio": ratio}
        found.append(entry)
    return found


def table(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    names = list(results)
    header = ["workload", *(column_label(n, results[n]) for n in names)]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * len(names)]
    for entry in ratios(results):
        cells = [f"{entry['workload']} ({entry['better']} is better)"]
        for name in names:
            figure = entry["values"][name]
            cell = _number(figure["value"])
            if name != "think-jobs" and figure["think_jobs_ratio"] is not None:
                ratio = figure["think_jobs_ratio"]
                cell += f" ({ratio:.2f}x)" if ratio >= 0.1 else f" ({ratio:.2g}x)"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    for section, label in (("fifo", "FIFO drain"), ("fifo_hot", "contended FIFO drain")):
        if all(section in results[n] for n in names):
            violations = " | ".join(str(results[n][section]["violations"]) for n in names)
            lines.append(f"| per-key order/exclusion violations, {label} | {violations} |")
    medians = f"Medians of {args.rounds} rounds (every side in turn), violations summed. "
    case = (medians if args.rounds > 1 else "") + (
        f"FIFO: {args.keys} keys x {args.jobs} jobs, {WORKERS} worker processes x "
        f"{args.concurrency}; contended FIFO: {args.hot_keys} keys x {args.hot_jobs} jobs, "
        f"the same workers; latency: {args.latency_count} jobs back to back on 1 worker "
        f"process x {args.concurrency}; accepts: {args.accept_count} enqueues one at a time"
    )
    note = (
        "Ratios in parentheses are think-jobs ÷ peer: above 1 think-jobs is ahead on the "
        "throughput rows (jobs/s, accepts/s), behind on the CPU and latency rows."
    )
    return "\n".join(lines) + f"\n\n{case}.\n{note}"


def versions_table(results: dict[str, dict[str, Any]]) -> str:
    rows = ["| Side | Versions |", "|---|---|"]
    for name, result in results.items():
        listed = ", ".join(f"{k} {v}" for k, v in result["versions"].items())
        rows.append(f"| {name} | {listed} |")
    return "\n".join(rows)


# -- main ------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = report.parser(__doc__.splitlines()[0], backends=None)
    parser.add_argument("--keys", type=int, default=100, help="FIFO keys (agents)")
    parser.add_argument("--jobs", type=int, default=50, help="FIFO jobs per key")
    parser.add_argument(
        "--hot-keys", type=int, default=3, help="keys of a second, contended drain (0: none)"
    )
    parser.add_argument("--hot-jobs", type=int, default=50, help="jobs per hot key")
    parser.add_argument("--concurrency", type=int, default=2, help="per worker process")
    parser.add_argument("--latency-count", type=int, default=50, help="lone jobs timed")
    parser.add_argument("--accept-count", type=int, default=500, help="enqueues timed")
    parser.add_argument(
        "--peers",
        default="think-jobs," + ",".join(p.name for p in PEERS),
        help="comma-separated, in column order (default: all)",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="rounds of every side in turn; medians reported"
    )
    parser.add_argument("--setup-only", action="store_true", help="only create the venvs")
    args = parser.parse_args(argv)
    if args.quick:
        args.keys, args.jobs, args.latency_count, args.accept_count = 2, 3, 10, 50
        args.hot_jobs = 5
    args.chosen = [name.strip() for name in str(args.peers).split(",") if name.strip()]
    unknown = set(args.chosen) - {"think-jobs", *BY_NAME}
    if unknown:
        parser.error(f"unknown peer(s): {', '.join(sorted(unknown))}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    for name in args.chosen:
        if name in BY_NAME:
            ensure_venv(BY_NAME[name])
    if args.setup_only:
        return {}
    started = dt.datetime.now(dt.UTC)
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in args.chosen}
    for number in range(1, args.rounds + 1):
        for name in args.chosen:
            print(f"[peers] round {number}/{args.rounds}: {name} ...", flush=True)
            begin = time.monotonic()
            peer = BY_NAME.get(name)
            rounds[name].append(run_think_jobs(args) if peer is None else run_peer(peer, args))
            print(f"[peers] {name} done in {time.monotonic() - begin:.0f} s", flush=True)
    results = {name: combine(found) for name, found in rounds.items()}
    machine = dict(report.machine())
    output: dict[str, Any] = {
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "machine": machine,
        "command": " ".join(["python -m bench.peers", *(argv or sys.argv[1:])]),
        "args": {k: v for k, v in vars(args).items() if k not in ("json",)},
        "results": results,
        "rounds": rounds,
        "rows": ratios(results),
    }
    print(f"\n## Peers ({started:%Y-%m-%d})\n", flush=True)
    print(table(results, args))
    print(f"\nMeasured {output['date']} on {os.cpu_count()} CPUs ({machine['CPU']}).\n")
    print(versions_table(results), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(output, indent=1, default=str))
    return output


if __name__ == "__main__":
    main()
