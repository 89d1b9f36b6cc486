"""The floor under ``bench.capacity``: the bare ingredient of a slow LLM turn — wait for the
next token, PUBLISH it — with no Celery and no think-jobs, in one process, two ways.

- ``threads``: N OS threads (what Celery's threads pool runs a turn on), each holding one
  connection of a bounded redis-py pool for its 50 tokens.
- ``asyncio``: N coroutines on one event loop (``redis.asyncio``, the same bounded pool).

Each of the N "turns" waits 50 ms and PUBLISHes a token, 50 times (~2.5 s, the ideal).
Printed: wall time ÷ the ideal, and this process's CPU per token. It answers one question
for issue 19's capacity target (at most 1.1 times the ideal at N = 500 on one worker
process): how close can the execution model itself come on this machine, before any work of
a job system?

    .venv/bin/python -m bench.capacity_floor [--quick] [--n 100,500,1000]
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis
import redis.asyncio

from bench.agents import SLOW_TOKEN_DELAY_S, SLOW_TOKENS
from bench.services import REDIS_URL

IDEAL_S = SLOW_TOKENS * SLOW_TOKEN_DELAY_S
_HEADROOM = 8


@dataclass(frozen=True)
class Run:
    model: str
    n: int
    wall_s: float
    cpu_s: float

    @property
    def ratio(self) -> float:
        return self.wall_s / IDEAL_S

    @property
    def cpu_us_per_token(self) -> float:
        return self.cpu_s / (self.n * SLOW_TOKENS) * 1e6


def _timed(model: str, n: int, body: Callable[[], None]) -> Run:
    cpu0, wall0 = time.process_time(), time.perf_counter()
    body()
    return Run(model, n, time.perf_counter() - wall0, time.process_time() - cpu0)


def threads(n: int, channel: str) -> Run:
    pool = redis.BlockingConnectionPool.from_url(REDIS_URL, max_connections=n + _HEADROOM)
    start = threading.Barrier(n + 1)

    def turn() -> None:
        client = redis.Redis(connection_pool=pool, single_connection_client=True)
        client.ping()  # connected before the clock starts
        start.wait()
        for _ in range(SLOW_TOKENS):
            time.sleep(SLOW_TOKEN_DELAY_S)
            client.publish(channel, "tok ")
        client.close()

    running = [threading.Thread(target=turn) for _ in range(n)]
    for thread in running:
        thread.start()

    def body() -> None:
        start.wait()
        for thread in running:
            thread.join()

    try:
        return _timed("threads", n, body)
    finally:
        pool.disconnect()


def coroutines(n: int, channel: str) -> Run:
    async def main() -> Run:
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            REDIS_URL, max_connections=n + _HEADROOM
        )
        client = redis.asyncio.Redis(connection_pool=pool)
        await asyncio.gather(*(client.ping() for _ in range(n)))  # the pool's connections

        async def turn() -> None:
            for _ in range(SLOW_TOKENS):
                await asyncio.sleep(SLOW_TOKEN_DELAY_S)
                await client.publish(channel, "tok ")

        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(turn() for _ in range(n)))
        run = Run("asyncio", n, time.perf_counter() - wall0, time.process_time() - cpu0)
        await client.aclose()
        await pool.disconnect()
        return run

    return asyncio.run(main())


def main(argv: list[str] | None = None) -> list[Run]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", default="100,500,1000", help="comma-separated turn counts")
    parser.add_argument("--quick", action="store_true", help="N = 20 only (a smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.n = "20"
    channel = f"bench-floor-{time.time_ns()}"
    runs: list[Run] = []
    print(f"{'model':<8} {'N':>5} {'wall ÷ ideal':>13} {'CPU per token':>14}")
    for n in (int(part) for part in args.n.split(",")):
        for measure in (threads, coroutines):
            run = measure(n, channel)
            runs.append(run)
            print(f"{run.model:<8} {n:>5} {run.ratio:>12.2f}x {run.cpu_us_per_token:>11.0f} µs")
    return runs


if __name__ == "__main__":
    main()
