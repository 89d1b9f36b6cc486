"""The one thread per process that sends many turns' stream chunks in one round trip, under load.

A ``StreamWriter`` sends a lone chunk at once, from the attempt's own thread: one round trip to
Redis per chunk. A worker running hundreds of slow LLM turns at once makes thousands of them a
second, each a socket write and a wait for the reply on its own thread, and the one core a
Python process runs on goes to those round trips and to the thread switches around them. So
while the process is *busy* — ``BUSY_AT`` or more chunk sends in flight, or this thread has
work — a writer hands its due chunks to this thread instead, which sends the due chunks of every
writer that handed some in one pipelined round trip per Redis pool (the same fenced append
script per writer, each with its own epoch, expected length and outcome). It batches by load,
not by a timer: a chunk handed over waits at most for the batch in flight and its own round
trip. A process that is not busy sends as before, so a lone chunk is never held.

It holds each writer's lock from taking its chunks to settling the outcome, as the writer's own
sends do (one send at a time per writer), and asks the lease first (``may_send``); a writer
whose lease says no keeps its chunks for its own thread, which decides (as with the flusher).
It is started by the first hand-over, in the process that writes (a forked child makes its
own), and is a daemon.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import redis

from think_jobs.transport.per_process import PerProcess

log = logging.getLogger(__name__)

BUSY_AT = 2  # chunk sends in flight in the process from which chunks go to the sender


class Batched(Protocol):
    """A writer as the sender sees it (``transport.streams.StreamWriter``)."""

    @property
    def lock(self) -> threading.Lock:
        """Held across each send of the writer, whichever thread makes it."""
        ...

    def take_batch(self) -> tuple[redis.Redis, list[Any]] | None:
        """With the lock held: the writer's client and the EVALSHA command of the due chunks,
        or None."""
        ...

    def settle_batch(self, result: Any) -> None:
        """With the lock held: what the command returned (or the exception it raised)."""
        ...


class StreamSender:
    """Sends the chunks writers hand over, all writers' at once."""

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.Lock())
        self._queued: list[Batched] = []
        self._active = False  # a batch is being sent
        self._thread: threading.Thread | None = None
        self._flights = 0  # chunk sends in flight on the writers' own threads
        self._count = threading.Lock()
        self.passes = 0  # hand-overs dealt with (each pass takes every writer queued)
        self.batches = 0  # round trips made (one per pool in a pass)

    # -- the writers' side -----------------------------------------------------------------

    def busy(self) -> bool:
        """Whether a chunk should be handed over rather than sent by its own thread."""
        return self._flights >= BUSY_AT or self._active or bool(self._queued)

    @contextmanager
    def sending(self) -> Iterator[None]:
        """Count a send a writer makes on its own thread while it is in flight."""
        with self._count:
            self._flights += 1
        try:
            yield
        finally:
            with self._count:
                self._flights -= 1

    def submit(self, writer: Batched) -> None:
        """Have the writer's due chunks sent with the next batch."""
        with self._changed:
            self._queued.append(writer)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="think-jobs-stream-sender", daemon=True
                )
                self._thread.start()
            self._changed.notify()

    # -- the thread ------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._changed:
                while not self._queued:
                    self._active = False
                    self._changed.wait()
                writers, self._queued = self._queued, []
                self._active = True
            try:
                self.send(writers)
            except Exception:  # a bug must not stop every other turn's chunks
                log.exception("stream sender: a batch failed")

    def send(self, writers: list[Batched]) -> None:
        """Send the due chunks of ``writers`` (each once), one pipelined round trip per pool."""
        unique = list({id(writer): writer for writer in writers}.values())
        for writer in unique:
            writer.lock.acquire()
        try:
            groups: dict[int, tuple[redis.Redis, list[tuple[Batched, list[Any]]]]] = {}
            for writer in unique:
                taken = writer.take_batch()
                if taken is not None:
                    client, command = taken
                    group = groups.setdefault(id(client.connection_pool), (client, []))
                    group[1].append((writer, command))
            for client, items in groups.values():
                self._send_group(client, items)
        finally:
            for writer in unique:
                writer.lock.release()
            self.passes += 1

    def _send_group(self, client: redis.Redis, items: list[tuple[Batched, list[Any]]]) -> None:
        """One pipelined round trip on the pool of ``client`` (any of the group's writers'
        clients: a pipeline takes a connection of its own from the pool)."""
        pipe = client.pipeline(transaction=False)
        for _, command in items:
            pipe.execute_command(*command)  # type: ignore[no-untyped-call]
        try:
            results: list[Any] = pipe.execute(raise_on_error=False)
        except redis.RedisError as error:
            results = [error] * len(items)
        self.batches += 1
        for (writer, _), result in zip(items, results, strict=True):
            writer.settle_batch(result)


_THIS_PROCESS: PerProcess[StreamSender] = PerProcess(StreamSender)


def process_sender() -> StreamSender:
    """The sender of this process."""
    return _THIS_PROCESS.get()
