"""Stream write coalescing: how late a live reader sees a chunk, lone or held, against the same
writer with coalescing off (``flush_window_s=0``: every chunk sent at once).

A writer in a child process writes pairs of chunks, the second right after the first, then
pauses (``--gap-ms``, 20 ms: a model streaming tokens); a plain redis-py subscriber in this
process notes when each arrives. The first of a pair is lone (nothing sent in the last window)
and goes out at once; the second comes within the window and, coalescing on, is held until the
flusher thread sends it when the window ends. Each chunk carries the wall-clock time it was
given to the writer (one machine, one clock).

    .venv/bin/python -m bench.stream_delay [--quick] [--pairs 500] [--window-ms 2]
"""

from __future__ import annotations

import json
import multiprocessing
import time
import uuid

import redis

from bench import measure, report
from bench.report import Figure
from bench.services import REDIS_URL
from think_jobs.keys import Keys
from think_jobs.transport.streams import StreamRef, StreamWriter, open_pubsub

REF = StreamRef("Bench:delay", "delay", 1)


def write_pairs(prefix: str, window_s: float, pairs: int, gap_s: float) -> None:
    """The child: ``pairs`` lone + held chunks, ``gap_s`` apart, then the end."""
    client = redis.Redis.from_url(REDIS_URL)
    keys = Keys(prefix)
    writer = StreamWriter(client, keys, REF, epoch=1, ttl_s=600, prefix=[], flush_window_s=window_s)
    for _ in range(pairs):
        for kind in ("lone", "held"):
            delta = json.dumps({"kind": kind, "at": time.time()})
            writer.chunk(json.dumps({"type": "text-delta", "id": "t", "delta": delta}))
        time.sleep(gap_s)
    writer.done("completed", None)
    client.close()


def delays_ms(window_s: float, pairs: int, gap_s: float) -> dict[str, list[float]]:
    """Run one writer; each chunk's delay (ms) from the writer's call to the subscriber."""
    client = redis.Redis.from_url(REDIS_URL)
    prefix = f"bench-delay-{uuid.uuid4().hex[:8]}"
    keys = Keys(prefix)
    pubsub = open_pubsub(client)
    pubsub.subscribe(keys.chunk_channel(REF.agent))
    child = multiprocessing.get_context("spawn").Process(
        target=write_pairs, args=(prefix, window_s, pairs, gap_s)
    )
    child.start()
    found: dict[str, list[float]] = {"lone": [], "held": []}
    try:
        _receive(pubsub, found)
    finally:
        child.join(60)
        pubsub.close()
        client.delete(*client.keys(f"{prefix}:*"))
        client.close()
    return found


def _receive(pubsub: redis.client.PubSub, found: dict[str, list[float]]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        message = pubsub.get_message(timeout=1.0)
        if message is None:
            continue
        event = json.loads(message["data"])
        if event.get("done"):
            return
        stamp = json.loads(event["chunk"]["delta"])
        found[stamp["kind"]].append((time.time() - stamp["at"]) * 1000)
    raise TimeoutError("the writer did not finish")


def figures(
    window_ms: float, on: dict[str, list[float]], off: dict[str, list[float]]
) -> list[Figure]:
    case = f"window {window_ms:g} ms, pairs {len(on['lone']):,}"
    reference = "coalescing off"
    found = []
    for kind in ("lone", "held"):
        for name, q in (("p50", 50), ("p99", 99), ("max", 100)):
            value, bare = measure.percentile(on[kind], q), measure.percentile(off[kind], q)
            metric = f"{kind} chunk {name} (ms)"
            found.append(Figure("stream delay", case, metric, value, bare, reference))
    return found


def main(argv: list[str] | None = None) -> list[Figure]:
    parser = report.parser(__doc__.splitlines()[0], backends=None)
    parser.add_argument("--pairs", type=int, default=500)
    parser.add_argument("--gap-ms", type=float, default=20.0)
    parser.add_argument("--window-ms", type=float, default=2.0)
    args = parser.parse_args(argv)
    if args.quick:
        args.pairs = 50
    gap_s = args.gap_ms / 1000
    off = delays_ms(0.0, args.pairs, gap_s)
    on = delays_ms(args.window_ms / 1000, args.pairs, gap_s)
    found = figures(args.window_ms, on, off)
    report.publish(found, args)
    return found


if __name__ == "__main__":
    main()
