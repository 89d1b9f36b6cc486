"""The agents and the bare Celery tasks the benchmarks run, and the Redis marks they leave.

Both sides of a comparison signal the benchmark the same way (one pipelined Redis round trip),
so the ratio measures think-jobs, not the measuring.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from think_jobs import ChatResponseResult, ModelRequest, Think
from think_jobs.context import utcnow
from think_jobs.messages import message_text
from think_jobs.models import Reply, ScriptedModel

if TYPE_CHECKING:
    from celery import Celery

    from think_jobs import ThinkJobs

PING_TASK = "bench.ping"
PING_WRITE_TASK = "bench.ping_write"
MARK_TASK = "bench.mark"
NOOP_TASK = "bench.noop"
PUBLISH_TASK = "bench.publish"
TOKENS_TASK = "bench.tokens"
STREAM_CHUNK_CHARS = 4
_DONE_TTL_S = 600


def ready_key(jobs: ThinkJobs) -> str:
    """SET of the pids of worker processes that are consuming."""
    return f"{jobs.keys.prefix}:bench:ready"


def done_key(jobs: ThinkJobs, request_id: str) -> str:
    """LIST a turn (or a ping task) pushes to when it has finished; the caller BLPOPs it."""
    return f"{jobs.keys.prefix}:bench:done:{request_id}"


def starts_key(jobs: ThinkJobs, agent_name: str) -> str:
    """LIST of the labels of an agent's turns, in the order their model calls started."""
    return f"{jobs.keys.prefix}:bench:starts:{agent_name}"


def counter_key(jobs: ThinkJobs, name: str) -> str:
    return f"{jobs.keys.prefix}:bench:{name}"


def signal_done(jobs: ThinkJobs, request_id: str) -> None:
    key = done_key(jobs, request_id)
    pipe = jobs.redis.pipeline(transaction=False)
    pipe.rpush(key, "1")
    pipe.expire(key, _DONE_TTL_S)
    pipe.execute()


_RESULTS = sa.Table(
    "bench_results",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("request_id", sa.String(64), nullable=False),
    sa.Column("result", sa.JSON),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)


def create_results_table(jobs: ThinkJobs) -> None:
    """The table ``ping_write`` stores its result rows in (created by the benchmark)."""
    _RESULTS.metadata.create_all(jobs.db.engine)


def write_result(jobs: ThinkJobs, request_id: str) -> None:
    row = {"request_id": request_id, "result": {"text": "ok"}, "created_at": utcnow()}
    with jobs.db.engine.begin() as conn:
        conn.execute(_RESULTS.insert().values(**row))


def mark_finished(jobs: ThinkJobs, *, started: float | None = None) -> None:
    """Count one finished unit of work and remember when the first and the last finished
    (and, given ``started``, when this one started: in the same round trip)."""
    now = repr(time.time())
    pipe = jobs.redis.pipeline(transaction=False)
    pipe.set(counter_key(jobs, "first"), now, nx=True)
    pipe.incr(counter_key(jobs, "done"))
    pipe.set(counter_key(jobs, "last"), now)
    if started is not None:
        pipe.rpush(counter_key(jobs, "starts"), repr(started))
    pipe.execute()


def last_user_text(request: ModelRequest) -> str:
    for message in reversed(request.messages):
        if message.role == "user":
            return message_text(message)
    return ""


class OneChunk(Think):
    """A one-chunk reply; tells the caller when its turn is done (turn overhead)."""

    def get_model(self) -> ScriptedModel:
        return ScriptedModel("ok")

    def on_chat_response(self, result: ChatResponseResult) -> None:
        signal_done(self.jobs, result.request_id)


class StartRecorder:
    """Records the label (the user message) of each turn as its model call starts."""

    def __init__(self, jobs: ThinkJobs, agent_name: str) -> None:
        self._jobs = jobs
        self._key = starts_key(jobs, agent_name)

    def stream(self, request: ModelRequest) -> Iterator[dict[str, Any]]:
        self._jobs.redis.rpush(self._key, last_user_text(request))
        yield from ScriptedModel("ok").stream(request)


class Ordered(Think):
    """One-chunk turns that record their start order per agent (FIFO throughput)."""

    def get_model(self) -> StartRecorder:
        return StartRecorder(self.jobs, self.name)

    def on_chat_response(self, result: ChatResponseResult) -> None:
        mark_finished(self.jobs)


class OrderedPlain(Think):
    """``Ordered`` without a hook, as most agents are (``fifo_throughput --plain``): when each
    turn finished is read from the database."""

    def get_model(self) -> StartRecorder:
        return StartRecorder(self.jobs, self.name)


def long_reply(request: ModelRequest) -> Reply:
    """As many chunks as the user message says (``STREAM_CHUNK_CHARS`` characters each)."""
    chunks = int(last_user_text(request) or "1")
    return Reply(text="word" * chunks, chunk_size=STREAM_CHUNK_CHARS)


class LongStream(Think):
    """One turn of many small text chunks (stream delivery rate)."""

    def get_model(self) -> ScriptedModel:
        return ScriptedModel(long_reply)


SLOW_TOKENS = 50
SLOW_TOKEN_DELAY_S = 0.05  # 20 tokens/s: a turn streams for ~2.5 s


def slow_reply(request: ModelRequest) -> Reply:
    """``SLOW_TOKENS`` words, one every ``SLOW_TOKEN_DELAY_S``: an LLM streaming at 20 tokens/s."""
    return Reply(text="tok " * SLOW_TOKENS, delay_s=SLOW_TOKEN_DELAY_S)


class SlowTokens(Think):
    """One slow turn that streams like a real model (capacity); counts itself finished."""

    def get_model(self) -> ScriptedModel:
        return ScriptedModel(slow_reply)

    def on_chat_response(self, result: ChatResponseResult) -> None:
        mark_finished(self.jobs)


AGENT_CLASSES: tuple[type[Think], ...] = (OneChunk, Ordered, OrderedPlain, LongStream, SlowTokens)


def register_bare_tasks(app: Celery, jobs: ThinkJobs) -> None:
    """The bare Celery tasks think-jobs is compared with, on the same app and queue."""

    @app.task(name=PING_TASK, ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
    def ping(request_id: str) -> None:
        signal_done(jobs, request_id)

    @app.task(name=PING_WRITE_TASK, ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
    def ping_write(request_id: str) -> None:
        """``ping`` that first stores a small result row and commits (the bare round trip
        the issue's latency target names: a job that writes its result)."""
        write_result(jobs, request_id)
        signal_done(jobs, request_id)

    @app.task(name=MARK_TASK, ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
    def mark() -> None:
        mark_finished(jobs)

    @app.task(name=NOOP_TASK, ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
    def noop() -> None:
        return None

    @app.task(name=PUBLISH_TASK, ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
    def publish(channel: str, source_key: str) -> None:
        """PUBLISH each item of a Redis list on ``channel``, one round trip each."""
        client = jobs.redis
        for payload in client.lrange(source_key, 0, -1):
            client.publish(channel, payload)

    register_capacity_task(app, jobs)


def register_capacity_task(app: Celery, jobs: ThinkJobs) -> None:
    """The bare reference of a slow turn: a task that PUBLISHes the same tokens at the same
    pace on the client (and pool) a turn's stream uses, then counts itself finished."""

    @app.task(name=TOKENS_TASK, ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
    def tokens(channel: str) -> None:
        started = time.time()
        client = jobs.clients.stream
        for seq in range(SLOW_TOKENS):
            time.sleep(SLOW_TOKEN_DELAY_S)
            client.publish(channel, f'{{"seq":{seq},"delta":"tok "}}')
        mark_finished(jobs, started=started)


def mark_ready(jobs: ThinkJobs) -> None:
    jobs.redis.sadd(ready_key(jobs), str(os.getpid()))
