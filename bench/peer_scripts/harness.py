"""The peer side of ``bench.peers``: the job every peer runs, and the driver that times it.

This module runs inside each peer's own virtualenv (``bench/.peers/<name>``), next to the
peer's script (``procrastinate_peer.py``, ``dbos_peer.py``, ``celery_peer.py``); it needs only
psycopg, redis and psutil, never think-jobs. A peer script gives the driver an ``Adapter``
(how to prepare the peer, enqueue one job, start one worker process); the driver runs the
three workloads and prints one JSON object on its last stdout line:

- FIFO drain: ``keys`` x ``jobs`` jobs enqueued interleaved (job n of every key, then n + 1)
  with no worker running, then ``workers`` worker processes (``concurrency`` each) drain them;
  jobs/s from the first finished job to the last (as ``bench.fifo_throughput`` does), worker
  CPU time from ready to done, and the per-key order and exclusion read back from the results
  table.
- Contended FIFO drain (``--hot-keys``): the same with a few keys, fewer than the workers'
  slots, so that each key's next job is queued right behind its running one.
- Lone job latency: one worker process; one job enqueued, then BLPOP of the Redis list the job
  pushes to when done, back to back.
- Accepts/s: with no worker running, one enqueue at a time, each to its own key.

Every job does the same work: INSERT one row into ``peer_results`` (its key, sequence number,
start time and the database's clock when the row is written, the worker's pid), autocommit,
then one pipelined Redis round trip (RPUSH + EXPIRE of its done list).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Protocol

import psutil
import psycopg
import redis
from proc import postgres_cpu_s

RESULTS_DDL = """
CREATE TABLE IF NOT EXISTS peer_results (
    id bigserial PRIMARY KEY,
    key text NOT NULL,
    seq integer NOT NULL,
    job_id text NOT NULL,
    started_at double precision NOT NULL,
    ended_at double precision NOT NULL,
    pid integer NOT NULL
)
"""
INSERT = (
    "INSERT INTO peer_results (key, seq, job_id, started_at, ended_at, pid) "
    "VALUES (%s, %s, %s, %s, extract(epoch FROM clock_timestamp()), %s)"
)
READY = "PEER-WORKER-READY"
DONE_TTL_S = 120
_local = threading.local()


# -- the job ---------------------------------------------------------------------------------


def done_key(job_id: str) -> str:
    return f"peers:done:{job_id}"


def _connection(db_url: str) -> psycopg.Connection[Any]:
    """One autocommit connection per worker thread, kept for the thread's life."""
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = psycopg.connect(db_url, autocommit=True)
        _local.conn = conn
    return conn


def _redis(redis_url: str) -> redis.Redis:
    client: redis.Redis | None = getattr(_local, "redis", None)
    if client is None:
        client = redis.Redis.from_url(redis_url)
        _local.redis = client
    return client


def run_job(db_url: str, redis_url: str, key: str, seq: int, job_id: str) -> None:
    """The work every peer's job does: one result row, then one done signal."""
    started = time.time()
    _connection(db_url).execute(INSERT, (key, seq, job_id, started, os.getpid()))
    pipe = _redis(redis_url).pipeline(transaction=False)
    pipe.rpush(done_key(job_id), "1")
    pipe.expire(done_key(job_id), DONE_TTL_S)
    pipe.execute()


def job_settings() -> tuple[str, str]:
    """(database URL, Redis URL) a worker process was started with."""
    return os.environ["PEER_DB_URL"], os.environ["PEER_REDIS_URL"]


def announce_ready() -> None:
    print(READY, flush=True)


# -- worker processes ------------------------------------------------------------------------


class Worker:
    """One worker subprocess of the peer (its own session, output collected)."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            command,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.output: list[str] = []
        self.ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            if READY in line:
                self.ready.set()

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.ready.wait(0.1):
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.stop()
                raise RuntimeError("worker did not start:\n" + "".join(self.output[-40:]))

    def cpu_s(self) -> float:
        """User + system CPU time of the process and its children so far."""
        try:
            proc = psutil.Process(self.process.pid)
            total = sum(proc.cpu_times()[:2])
            for child in proc.children(recursive=True):
                with suppress(psutil.Error):
                    total += sum(child.cpu_times()[:2])
            return float(total)
        except psutil.Error:
            return 0.0

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.process.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        self._reader.join(5)


# -- what a peer script provides -------------------------------------------------------------


class Adapter(Protocol):
    """How the driver uses one peer."""

    name: str
    packages: tuple[str, ...]

    def setup(self) -> None:
        """Create the peer's schema/queues (before any worker starts)."""

    def enqueue(self, key: str, seq: int, job_id: str) -> None:
        """Enqueue one job for ``key`` (ordered and exclusive per key where the peer can)."""

    def worker_command(self, concurrency: int) -> list[str]:
        """The command line of one worker process."""

    def close(self) -> None:
        """Release the driver's connections."""


@dataclass
class Options:
    db_url: str
    redis_url: str
    keys: int
    jobs: int
    hot_keys: int
    hot_jobs: int
    workers: int
    concurrency: int
    latency_count: int
    accept_count: int
    timeout_s: float

    @property
    def env(self) -> dict[str, str]:
        return {"PEER_DB_URL": self.db_url, "PEER_REDIS_URL": self.redis_url}


def options_parser(description: str) -> argparse.ArgumentParser:
    found = argparse.ArgumentParser(description=description)
    sub = found.add_subparsers(dest="command", required=True)
    driver = sub.add_parser("driver", help="run the workloads, print JSON")
    driver.add_argument("--db-url", required=True)
    driver.add_argument("--redis-url", required=True)
    driver.add_argument("--keys", type=int, default=100)
    driver.add_argument("--jobs", type=int, default=50)
    driver.add_argument("--hot-keys", type=int, default=0, help="a second, contended drain")
    driver.add_argument("--hot-jobs", type=int, default=50)
    driver.add_argument("--workers", type=int, default=2)
    driver.add_argument("--concurrency", type=int, default=2)
    driver.add_argument("--latency-count", type=int, default=50)
    driver.add_argument("--accept-count", type=int, default=500)
    driver.add_argument("--timeout-s", type=float, default=900.0)
    worker = sub.add_parser("worker", help="one worker process (started by the driver)")
    worker.add_argument("--concurrency", type=int, default=2)
    return found


def options_of(args: argparse.Namespace) -> Options:
    return Options(
        db_url=args.db_url,
        redis_url=args.redis_url,
        keys=args.keys,
        jobs=args.jobs,
        hot_keys=args.hot_keys,
        hot_jobs=args.hot_jobs,
        workers=args.workers,
        concurrency=args.concurrency,
        latency_count=args.latency_count,
        accept_count=args.accept_count,
        timeout_s=args.timeout_s,
    )


# -- the workloads ---------------------------------------------------------------------------


@contextmanager
def workers(adapter: Adapter, options: Options, count: int) -> Iterator[list[Worker]]:
    command = adapter.worker_command(options.concurrency)
    started = [Worker(command, options.env) for _ in range(count)]
    try:
        for worker in started:
            worker.wait_ready()
        yield started
    finally:
        for worker in started:
            worker.stop()


def _scalar(conn: psycopg.Connection[Any], query: str) -> Any:
    row = conn.execute(query).fetchone()
    return None if row is None else row[0]


@dataclass
class Verdict:
    rows: int = 0
    missing: int = 0
    duplicates: int = 0
    keys_out_of_order: int = 0
    overlaps: int = 0

    @property
    def violations(self) -> int:
        return self.missing + self.duplicates + self.keys_out_of_order + self.overlaps


def verify(conn: psycopg.Connection[Any], expected: dict[str, int]) -> Verdict:
    """Per key: every job once, started in ``seq`` order, none started before the previous
    one's row was written."""
    rows = conn.execute("SELECT key, seq, started_at, ended_at FROM peer_results").fetchall()
    verdict = Verdict(rows=len(rows))
    per_key: dict[str, list[tuple[int, float, float]]] = {}
    for key, seq, started, ended in rows:
        per_key.setdefault(key, []).append((seq, started, ended))
    for key, count in expected.items():
        found = per_key.get(key, [])
        seqs = {seq for seq, _, _ in found}
        verdict.missing += count - len(seqs & set(range(count)))
        verdict.duplicates += len(found) - len(seqs)
        by_start = sorted(found, key=lambda item: item[1])
        verdict.keys_out_of_order += [s for s, _, _ in by_start] != sorted(s for s, _, _ in found)
        verdict.overlaps += sum(
            after[1] < before[2] for before, after in itertools.pairwise(by_start)
        )
    return verdict


def fifo_drain(
    adapter: Adapter,
    options: Options,
    conn: psycopg.Connection[Any],
    *,
    key_count: int,
    per_key: int,
    prefix: str = "fifo",
) -> dict[str, Any]:
    keys = [f"{prefix}-{k}" for k in range(key_count)]
    for seq in range(per_key):
        for key in keys:
            adapter.enqueue(key, seq, uuid.uuid4().hex)
    expected = key_count * per_key
    with workers(adapter, options, options.workers) as running:
        cpu_before, pg_before = sum(w.cpu_s() for w in running), postgres_cpu_s()
        deadline = time.monotonic() + options.timeout_s
        while _scalar(conn, "SELECT count(*) FROM peer_results") < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"FIFO drain not finished in {options.timeout_s:g} s")
            time.sleep(0.1)
        cpu = sum(w.cpu_s() for w in running) - cpu_before
        pg_cpu = postgres_cpu_s() - pg_before
    row = conn.execute("SELECT min(ended_at), max(ended_at) FROM peer_results").fetchone()
    assert row is not None
    seconds = float(row[1]) - float(row[0])
    verdict = verify(conn, dict.fromkeys(keys, per_key))
    conn.execute("TRUNCATE peer_results")
    return {
        "jobs": expected,
        "seconds": seconds,
        "jobs_per_s": (expected - 1) / seconds if seconds > 0 else float("nan"),
        "worker_cpu_s": cpu,
        "cpu_ms_per_job": cpu * 1000 / expected,
        "postgres_cpu_ms_per_job": pg_cpu * 1000 / expected,
        "violations": verdict.violations,
        "verdict": verdict.__dict__,
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def lone_latency(adapter: Adapter, options: Options, client: redis.Redis) -> dict[str, Any]:
    """Enqueue one job, wait for its done signal; back to back, keys rotating over 16."""

    def one(index: int) -> float:
        job_id = uuid.uuid4().hex
        start = time.perf_counter()
        adapter.enqueue(f"lone-{index % 16}", index, job_id)
        if client.blpop([done_key(job_id)], timeout=30) is None:
            raise TimeoutError(f"lone job {job_id} not done in 30 s")
        return (time.perf_counter() - start) * 1000

    with workers(adapter, options, 1):
        for index in range(min(10, options.latency_count)):  # warm-up
            one(index)
        samples = [one(10 + index) for index in range(options.latency_count)]
    return {
        "count": len(samples),
        "p50_ms": percentile(samples, 50),
        "p99_ms": percentile(samples, 99),
        "mean_ms": statistics.fmean(samples),
    }


def accepts(adapter: Adapter, options: Options) -> dict[str, Any]:
    """One enqueue at a time, each to a key with nothing queued; no worker runs."""
    samples: list[float] = []
    for index in range(options.accept_count):
        start = time.perf_counter()
        adapter.enqueue(f"accept-{index}", 0, uuid.uuid4().hex)
        samples.append((time.perf_counter() - start) * 1000)
    return {
        "count": len(samples),
        "accepts_per_s": len(samples) / (sum(samples) / 1000),
        "p50_ms": percentile(samples, 50),
        "p99_ms": percentile(samples, 99),
    }


def versions(packages: tuple[str, ...]) -> dict[str, str]:
    return {name: metadata.version(name) for name in packages}


def drive(adapter: Adapter, options: Options) -> dict[str, Any]:
    """FIFO drain, then lone latency, then accepts (the queue is left full: the database is
    dropped afterwards)."""
    client = redis.Redis.from_url(options.redis_url, socket_timeout=None)  # BLPOP waits 30 s
    with psycopg.connect(options.db_url, autocommit=True) as conn:
        conn.execute(RESULTS_DDL)
        adapter.setup()
        try:
            found: dict[str, Any] = {"peer": adapter.name, "versions": versions(adapter.packages)}
            found["fifo"] = fifo_drain(
                adapter, options, conn, key_count=options.keys, per_key=options.jobs
            )
            if options.hot_keys:
                found["fifo_hot"] = fifo_drain(
                    adapter,
                    options,
                    conn,
                    key_count=options.hot_keys,
                    per_key=options.hot_jobs,
                    prefix="hot",
                )
            found["latency"] = lone_latency(adapter, options, client)
            found["accept"] = accepts(adapter, options)
        finally:
            adapter.close()
            client.close()
    return found


def main(
    description: str,
    make_adapter: Callable[[Options], Adapter],
    run_worker: Callable[[int], None],
) -> None:
    """The entry point of a peer script: ``driver`` (prints JSON) or ``worker``."""
    args = options_parser(description).parse_args()
    if args.command == "worker":
        run_worker(args.concurrency)
        return
    options = options_of(args)
    result = drive(make_adapter(options), options)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
