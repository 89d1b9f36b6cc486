"""Keeping what a cancelled turn streamed when its attempt could not store it (SPEC §5: a
running turn cancelled keeps its partial reply).

A running turn's attempt stores its partial itself when a cancel reaches it. One that cannot
— killed, frozen or cut off past its lease, its final write refused for longer than the
lease — leaves the stream ahead of the stored partial, and no recovery follows a cancel. The
process that next takes the agent's lease over from the lapsed holder (``queueing``'s claim,
which commits the take-over and starts nothing: ``queueing.Unsettled``; the holder's writes
are fenced from then on) stores the partial the stream shows under that lease, before the
agent's next turn applies its messages. It ends the stream before it reads it, so what it
stores is all a client will ever see there; and it holds no transaction while it talks to
Redis.
"""

from __future__ import annotations

import logging
from datetime import datetime

from think_jobs import replay
from think_jobs.db import agents as agent_ops
from think_jobs.db import conversation as conversation_ops
from think_jobs.db.engine import Connection
from think_jobs.domain.records import AgentRef, TurnRecord
from think_jobs.engine import approvals, continuation
from think_jobs.engine.ports import Services
from think_jobs.engine.queueing import Unsettled
from think_jobs.errors import BrokerUnavailableError
from think_jobs.keys import agent_address
from think_jobs.messages import UIMessage, readable_message
from think_jobs.results import StreamEvent
from think_jobs.transport import streams
from think_jobs.transport.clients import broker_errors
from think_jobs.transport.streams import StoredEnd, StreamRef

log = logging.getLogger(__name__)


def cancelled_turn(services: Services, agent: AgentRef, unsettled: Unsettled) -> bool:
    """Store the partial reply the stream of the cancelled turn shows, when it shows more
    than the stored one, under the lease the claim took over (``unsettled.token``); False
    when the stream cannot be read now (Redis unreachable: logged), and the turn is still to
    settle (by whoever takes the lease over once it lapsed). The stream is ended and read
    with no transaction open (a Redis that hangs holds no row and, on SQLite, no write lock);
    the write renews the lease first and stores nothing if it was lost meanwhile (whoever
    took it over settles the turn again). A stream Redis lost leaves the stored partial as it
    is; so does one its attempt ended itself (it stored its partial first, and what is stored
    now may have been deleted since, as ``clear_messages`` does)."""
    turn = unsettled.turn
    if turn.assistant_message_id is None:
        return True
    address = agent_address(agent.agent_type, agent.agent_name)
    try:
        events = _ended_stream(services, turn, StreamRef(address, turn.request_id, turn.id))
    except BrokerUnavailableError as error:
        log.warning("stream of cancelled request %s unread: %s", turn.request_id, error)
        return False
    if events is None:
        return True
    with services.db.write() as conn:
        held = agent_ops.renew_lease(
            conn, agent.id, unsettled.token, ttl_s=services.settings.lease_ttl_s
        )
        if held is not None:
            _store(conn, turn, events, held.now)
    return True


def _store(conn: Connection, turn: TurnRecord, events: list[StreamEvent], now: datetime) -> None:
    chunks = [event.chunk for event in events if event.chunk is not None]
    base = approvals.answered_base_in(conn, turn)
    stored = _stored(conn, turn)
    if stored is not None and replay.suffix(chunks, stored, finished=False, base=base) is not None:
        return  # the stream leads to what is stored: the attempt stored its partial itself
    recovered = continuation.recover(turn, events, None, seed=base)
    if not recovered.has_content:
        return
    conversation_ops.upsert_message(
        conn, turn.agent_id, recovered.message.to_wire(), turn_id=turn.id, now=now
    )
    log.warning(
        "cancelled request %s: stored the partial reply its stream shows (its attempt could "
        "not)", turn.request_id,
    )  # fmt: skip


def _ended_stream(services: Services, turn: TurnRecord, ref: StreamRef) -> list[StreamEvent] | None:
    """The stream's events, ended first (``done`` from the database, unless a reader ended it
    already): nothing lands in it after that, not even a send of the dead attempt still in
    flight, so what is read is all a client will ever see. None when there is nothing to
    settle: no chunk (the buffer is gone: readers rebuild it from the database), the
    attempt ended it itself, or a reader ended it and the attempt then stored the partial it
    shows (``stored_by_attempt``). Raises ``BrokerUnavailableError`` when Redis cannot be read."""
    with broker_errors("reading a cancelled turn's stream"):
        events = streams.buffered_events(services.redis, services.keys, ref)
        if not any(event.chunk is not None for event in events):
            return None
        last = events[-1]
        if last.done and (last.attempt or 0) < streams.STORE_EPOCH:
            return None  # its attempt stored its partial, then ended the stream
        if last.done and streams.stored_by_attempt(services.redis, services.keys, ref):
            return None  # a reader ended it, then its attempt stored the partial it shows
        end = StoredEnd(turn.status, turn.error, None)
        streams.seal_from_store(
            services.redis, services.keys, ref, end, ttl_s=services.settings.stream_ttl_s
        )
        return streams.buffered_events(services.redis, services.keys, ref)


def _stored(conn: Connection, turn: TurnRecord) -> UIMessage | None:
    assert turn.assistant_message_id is not None
    return readable_message(
        conversation_ops.message_json(conn, turn.agent_id, turn.assistant_message_id)
    )
