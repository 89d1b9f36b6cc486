"""The one owner of a claim: the lease, the watch, the stream's fence, the final write, release.

Whoever holds a claim runs it through here: a Celery worker for submissions, the calling
process for blocking calls (``save_messages``, ``chat``, ``continue_last_turn``). For the whole
attempt this module holds the agent's ``Lease`` (every write of the attempt is fenced by it),
runs the ``TurnWatch`` (heartbeat, signals), opens the turn's stream with the attempt number
as its epoch (taking it over first when an earlier attempt may have written to it), runs the
``Attempt``, and writes its ending:

- ``Finished``: the reply and the final status in one fenced transaction — which also gives the
  lease back when nothing runs inside the turn afterwards (no hook, no caller, no next turn
  to keep it for), and stores the approvals the turn stopped at with the continuation that
  takes its place in line (``engine.approvals``) — then the stream's ``done`` and the hooks,
  then the release;
- ``Interrupted`` by a stall: the partial reply is stored and the turn handed back to recovery;
- ``Interrupted`` because the lease was lost: nothing is written and nothing released, since
  another attempt owns the turn now. A stale attempt therefore never writes anything.

Hooks run inside the turn, while the lease is still held, so a slow ``on_chat_response``
delays the agent's next turn and a ``submit_messages`` made there is admitted before anything
that comes later.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from think_jobs.db import agents as agent_ops
from think_jobs.db import conversation as conversation_ops
from think_jobs.db import turns as turn_ops
from think_jobs.db.engine import ConcurrentWrite, Connection
from think_jobs.domain.policy import DELETED
from think_jobs.domain.records import (
    AgentRef,
    Claim,
    Ended,
    Idle,
    NotClaimed,
    Released,
    TurnRecord,
)
from think_jobs.domain.status import INTERRUPTED, Status, StopKind
from think_jobs.engine import approvals, followups, handoff, queueing, settle
from think_jobs.engine.attempt import (
    LEASE_LOST,
    Attempt,
    CallerTurn,
    Interrupted,
    MessagesFunction,
    Tools,
    TurnResult,
    Written,
    store_reply,
)
from think_jobs.engine.lease import Lease, LeaseLost
from think_jobs.engine.model_loop import RunOutcome
from think_jobs.engine.ports import AgentHooks, Services
from think_jobs.engine.watch import TurnWatch, WatchTimings
from think_jobs.errors import StorageUnavailableError, ThinkJobsError
from think_jobs.messages import new_message_id
from think_jobs.transport.streams import StreamRef, StreamWriter

__all__ = ["INTERRUPTED", "CallerTurn", "MessagesFunction", "TurnResult", "execute"]

log = logging.getLogger(__name__)

_Final = tuple[Ended | None, str, str | None]  # the turn's ending, and its status and error
_FINAL_RETRY_FIRST_S = 0.05  # a final write the database refused is tried again this soon,
_FINAL_RETRY_MAX_S = 1.0  # then twice as late each time, up to this

_ACTIVE_AGENTS: contextvars.ContextVar[Mapping[str, Lease]] = contextvars.ContextVar(
    "think_jobs_active_agents", default=MappingProxyType({})
)


def in_active_turn(address: str) -> bool:
    """True inside a turn (or its hooks) of the agent at ``address`` in this thread/context."""
    return address in _ACTIVE_AGENTS.get()


def active_lease(address: str) -> Lease | None:
    """The lease of the turn (or its hooks) of the agent at ``address`` running in this
    thread/context: what an agent-wide write made from inside it is fenced by."""
    return _ACTIVE_AGENTS.get().get(address)


def agent_write(
    services: Services, agent: AgentHooks, kind: str
) -> AbstractContextManager[Connection]:
    """A write transaction on the whole agent (a reset, an abort of its running turns, the
    deletion of its conversation). Made from inside one of the agent's turns (its tools, its
    hooks) it is fenced by that turn's lease, as the turn's own writes are: a worker that lost
    the lease (paused or cut off past its TTL, a hook hung past the time limit) is no longer
    in the agent's turn — its next turn may be running elsewhere — so the write raises
    ``LeaseLost`` and changes nothing. ``kind`` names the write in metrics."""
    lease = active_lease(agent.address)
    return services.db.write() if lease is None else lease.write(kind)


@contextmanager
def _active(address: str, lease: Lease) -> Iterator[None]:
    token = _ACTIVE_AGENTS.set(MappingProxyType({**_ACTIVE_AGENTS.get(), address: lease}))
    try:
        yield
    finally:
        _ACTIVE_AGENTS.reset(token)


# -- claiming ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claimed:
    """A claim and the lease it holds for its attempt; ``answered`` is when the claim's
    answer came back (monotonic), after the database stamped the turn's ``started_at``."""

    claim: Claim
    lease: Lease
    answered: float


def claim(
    services: Services,
    agent: AgentRef,
    *,
    caller_turn_id: int | None = None,
    held: Lease | None = None,
) -> Claimed | NotClaimed:
    """Take the agent's lease (or renew ``held``) and start its next turn (see
    ``queueing.claim_next``); a turn whose messages are already applied gets its conversation
    read in the same transaction. A lease taken over from under a turn cancelled meanwhile is
    committed first; the turn's partial is stored under it (``settle.cancelled_turn``: no
    transaction is open while Redis is read), then the claim goes on with it. If the stream
    cannot be read now (Redis unreachable), nothing is claimed and the lease is left to lapse
    by its TTL (a back-off: the sweeper does not drain a leased agent), after which the next
    claim settles the turn first; if the claim fails (an interrupt, the database), the lease is
    ended at once as a dead holder's would be (``agent_ops.lapse_lease``)."""
    token = held.token if held is not None else None
    taken = _claim(services, agent, caller_turn_id, token)
    if not isinstance(taken, queueing.Unsettled):
        return taken
    try:
        settled = _settle(services, agent, taken)
        claimed = _claim(services, agent, caller_turn_id, taken.token) if settled else None
    except BaseException:
        _lapse(services, agent, taken.token)
        raise
    if claimed is None:
        return NotClaimed(Idle.BUSY)
    assert not isinstance(claimed, queueing.Unsettled)  # a lease renewed settles nothing
    return claimed


def _settle(services: Services, agent: AgentRef, taken: queueing.Unsettled) -> bool:
    """``settle.cancelled_turn``. A failure that another try may not meet (the package's
    errors, a concurrent write) is raised; any other is logged and the turn keeps the partial
    stored before: a stream that cannot be settled must not stop the agent's queue for good
    (every claim would meet it again)."""
    try:
        return settle.cancelled_turn(services, agent, taken)
    except (ThinkJobsError, ConcurrentWrite):
        raise
    except Exception:
        log.exception(
            "cancelled request %s: the partial its stream shows could not be stored; it keeps "
            "the one stored before", taken.turn.request_id,
        )  # fmt: skip
        return True


def _lapse(services: Services, agent: AgentRef, token: str) -> None:
    """End the lease (best effort: a database that refuses now lets it lapse by its TTL; what
    went wrong before is what the caller raises)."""
    try:
        with services.db.write() as conn:
            agent_ops.lapse_lease(conn, agent.id, token)
    except Exception as error:
        log.warning("lease of agent %s left to lapse by itself: %s", agent.id, error)


def _claim(
    services: Services, agent: AgentRef, caller_turn_id: int | None, token: str | None
) -> Claimed | NotClaimed | queueing.Unsettled:
    sent = time.monotonic()
    if services.db.one_statement_writes:  # the common case
        with services.db.statement() as conn:
            fresh = queueing.claim_fresh(
                conn, agent, held_token=token, lease_ttl_s=services.settings.lease_ttl_s
            )
        if isinstance(fresh, Claim):
            return Claimed(fresh, _lease(services, fresh, sent), time.monotonic())
        token = fresh or token  # a lease it took without a turn is ours to go on with
    with services.db.write() as conn:
        return _claim_in(services, conn, agent, sent, caller_turn_id=caller_turn_id, token=token)


def _claim_in(
    services: Services,
    conn: Connection,
    agent: AgentRef,
    sent: float,
    *,
    caller_turn_id: int | None = None,
    token: str | None = None,
    renewed: agent_ops.Held | None = None,
) -> Claimed | NotClaimed | queueing.Unsettled:
    settings = services.settings
    claimed = queueing.claim_next(
        conn,
        agent,
        lease_ttl_s=settings.lease_ttl_s,
        max_recoveries=settings.recovery_max_attempts,
        caller_turn_id=caller_turn_id,
        held_token=token,
        renewed=renewed,
        settle_lapsed=True,
    )
    if isinstance(claimed, NotClaimed | queueing.Unsettled):
        return claimed
    if claimed.turn.messages_applied:
        claimed = replace(claimed, history=conversation_ops.load_messages_json(conn, agent.id))
    return Claimed(claimed, _lease(services, claimed, sent), time.monotonic())


def _lease(services: Services, claim: Claim, sent: float) -> Lease:
    settings = services.settings
    ttl_s = settings.lease_ttl_s
    started = claim.turn.started_at
    assert started is not None
    # Stop this long before the lease may lapse: a watch poll and a chunk or two.
    safety_s = min(ttl_s / 3, max(2 * settings.cancel_poll_interval_s, ttl_s / 10))
    return Lease(services.db, claim.agent_id, claim.token, ttl_s, sent + ttl_s, started, safety_s)


# -- running -----------------------------------------------------------------------------------


def execute(services: Services, claimed: Claimed, caller: CallerTurn | None = None) -> TurnResult:
    """Run the claimed turn to its end, then release the lease and hand on to the next turn."""
    ran = run_and_release(services, claimed, caller)
    if ran.released is not None:
        handoff.released(services, claimed.claim.agent, ran.released)
    return ran.result


@dataclass(frozen=True)
class Ran:
    """How an attempt ended for its runner: its result; the agent's queue as the lease was
    given back (None: lost, kept, or the release failed); and, when the lease was kept, the
    next turn already claimed with the final write (or why there was none)."""

    result: TurnResult
    released: Released | None
    following: Claimed | NotClaimed | None = None


def run_and_release(
    services: Services,
    claimed: Claimed,
    caller: CallerTurn | None = None,
    *,
    keep_lease: bool = False,
) -> Ran:
    """Run the claimed turn and release the lease; the caller decides who runs what is next.

    With ``keep_lease`` the lease is kept for the next turn: on SQLite, with no hook to run
    after the final write, that write also claims the next turn (``Ran.following``);
    otherwise the caller claims it with ``claim(..., held=claimed.lease)``.
    """
    claim, lease = claimed.claim, claimed.lease
    agent = services.agents.instantiate(claim.agent_type, claim.agent_name)
    tools = _tools(services, agent, claimed, caller)
    run = _Run(services, agent, claim, caller, tools, keep_lease=keep_lease)
    if caller is None:  # a drain's turn: a stopping worker hands it over (engine.handover)
        services.running.add(tools.watch)
    try:
        with _active(agent.address, lease):
            result = run.perform()
    finally:
        services.running.discard(tools.watch)
        tools.watch.close()
        tools.writer.close()  # after done() nothing; else what it held, if the lease allows
        services.clients.release(tools.writer.client)  # the turn's stream connection
    return Ran(result, run.finish_release(), run.following)


def _tools(
    services: Services, agent: AgentHooks, claimed: Claimed, caller: CallerTurn | None
) -> Tools:
    claim, lease = claimed.claim, claimed.lease
    turn = claim.turn
    watch = TurnWatch(
        lease,
        turn,
        revocations=services.revocations,
        revocation_key=services.keys.revoked(agent.address, turn.id),
        timings=WatchTimings(
            services.settings.heartbeat_interval_s, services.settings.cancel_poll_interval_s
        ),
        signal=caller.signal if caller else None,
        stall_timeout_s=agent.stall_timeout_s,
        turn_timeout_s=agent.turn_timeout_s,
        began=_began(claimed),
    ).start()  # first: taking a stream connection may wait on an unreachable Redis
    try:
        writer = _writer(services, agent, turn, lease, watch)
    except BaseException:
        watch.close()
        raise
    return Tools(lease, watch, writer)


def _began(claimed: Claimed) -> float:
    """When the claimed turn first started, on this process's monotonic clock: when the
    claim's answer came back less the time the database says the turn had run by then (an
    earlier attempt's). Counted from the answer, which comes after the database stamped
    ``started_at``, a time limit never ends a turn before its limit on the database's clock
    (it may end it a round trip late); the lease, by contrast, counts from when the claim
    was sent. Only the database's clock is read: a worker whose wall clock is off measures
    the same."""
    claim = claimed.claim
    started = claim.turn.started_at
    if started is None:
        return claimed.answered
    return claimed.answered - max(0.0, (claim.now - started).total_seconds())


def _writer(
    services: Services, agent: AgentHooks, turn: TurnRecord, lease: Lease, watch: TurnWatch
) -> StreamWriter:
    writer = StreamWriter(
        services.clients.turn_stream(),  # held until the attempt ends (``run_and_release``)
        services.keys,
        StreamRef(agent.address, turn.request_id, turn.id),
        epoch=turn.attempt,
        ttl_s=services.settings.stream_ttl_s,
        prefix=[] if turn.attempt <= 1 else None,  # a first attempt's stream is empty
        may_send=lease.locally_valid,
        done_timeout_s=services.settings.broker_publish_timeout_s,
        flush_window_s=services.settings.stream_flush_window_ms / 1000,
    )
    if turn.attempt > 1:
        # Before the partial is read (nothing stale can be added after), and waiting for an
        # unreachable Redis up to a lease's length, for as long as the attempt may go on:
        # without what the stream holds it would continue from the stored partial alone.
        with watch.setting_up():  # not a stall: the model has not started
            writer.take_over_within(
                services.settings.lease_ttl_s,
                keep_trying=lambda: watch.reason is None and lease.locally_valid(),
            )
    return writer


class _Run:
    """One attempt's life as this module owns it: run, write the ending, deliver, release."""

    def __init__(
        self,
        services: Services,
        agent: AgentHooks,
        claim: Claim,
        caller: CallerTurn | None,
        tools: Tools,
        *,
        keep_lease: bool,
    ) -> None:
        self.services, self.claim, self.tools = services, claim, tools
        self.attempt = Attempt(services, agent, claim, caller, tools)
        # With no hook or callback to run inside the turn after the final write, that write
        # also releases the lease, or claims the next turn when the lease is kept for it: one
        # transaction less per turn. On PostgreSQL that is one statement
        # (``db.final_write.write_final_and_claim``), on SQLite the final write's transaction.
        alone = caller is None and not _has_turn_hooks(agent)
        self.release_with_final = alone and not keep_lease
        claim_next = alone and keep_lease
        self.claim_in_statement = claim_next and services.db.one_statement_writes
        self.claim_in_transaction = claim_next and not services.db.one_statement_writes
        self.keep_lease = keep_lease
        self.released: Released | None = None
        self.following: Claimed | NotClaimed | None = None
        self.continuation: TurnRecord | None = None  # admitted when the turn asked approvals
        self.ended = False  # the final write is stored: the turn is over
        self.lost = False

    def perform(self) -> TurnResult:
        ending = self.attempt.run()
        if isinstance(ending, Interrupted):
            return self._interrupted(ending)
        try:
            written = self._write_final(ending.outcome)
        except LeaseLost:
            return self._interrupted(Interrupted(LEASE_LOST))
        return self.attempt.deliver(ending.outcome, written)

    def _write_final(self, outcome: RunOutcome) -> Written:
        """The reply and the final status, fenced (never over a status set meanwhile): in one
        statement when nothing else goes with them (PostgreSQL, ``Lease.write_final``), else
        in the fenced transaction."""
        status, error = self.attempt.final_status(outcome)
        if self.tools.lease.reply_dropped:  # the turn cleared the conversation it was in
            outcome = replace(outcome, has_content=False)
        alone = not (outcome.asked or self.claim_in_transaction)  # nothing else to write with it
        write = (
            self._final_statement
            if alone and self.services.db.one_statement_writes
            else self._final_transaction
        )
        ended, status, error = self._through_outage(lambda: write(outcome, status, error))
        self.ended = True
        self.tools.watch.written()  # what follows is inside the turn: the lease is kept for it
        followups.send_after_end(self.services, self.claim.turn.id, ended)
        if self.continuation is not None:
            approvals.announce_continuation(self.attempt.agent, self.continuation)
        return Written(status, error, by_us=ended is not None)

    def _through_outage(self, write: Callable[[], _Final]) -> _Final:
        """The final write, tried again while the database is out of reach, for up to a lease
        TTL after the first failure: a failover or a dropped connection costs the turn a wait,
        not a recovery (nor, for a turn cancelled meanwhile, what it streamed since its last
        stored partial). Safe to repeat: the write is fenced, never overwrites a final
        status, and a try that committed but whose answer was lost leaves the next one
        nothing to change (or, if it gave the lease back, ``LeaseLost``). Raises
        ``StorageUnavailableError`` once the TTL passed."""
        deadline: float | None = None
        delay_s = _FINAL_RETRY_FIRST_S
        while True:
            try:
                return write()
            except StorageUnavailableError as error:
                now = time.monotonic()
                deadline = now + self.tools.lease.ttl_s if deadline is None else deadline
                if now >= deadline:
                    raise
                log.warning(
                    "final write of request %s failed (%s): trying again in %.2f s",
                    self.claim.turn.request_id, error, delay_s,
                )  # fmt: skip
                time.sleep(min(delay_s, deadline - now))
                delay_s = min(2 * delay_s, _FINAL_RETRY_MAX_S)

    def _final_statement(
        self, outcome: RunOutcome, status: str, error: str | None
    ) -> tuple[Ended | None, str, str | None]:
        turn, lease = self.claim.turn, self.tools.lease
        reply = outcome.message.to_wire() if outcome.has_content else None
        releasing = self.release_with_final
        if self.claim_in_statement:
            ended = self._final_claiming_next(status, error, reply)
        else:
            ended = lease.write_final(
                turn, status=status, error=error, reply=reply, releasing=releasing
            )
        if ended is None:
            with self.services.db.statement() as conn:
                status, error = _stored_ending(conn, turn, status, error)
        if releasing:
            self.released = lease.next_head(turn.seq)
        return ended, status, error

    def _final_claiming_next(
        self, status: str, error: str | None, reply: dict[str, Any] | None
    ) -> Ended | None:
        """The final write, with the next turn claimed in its statement when it can be
        (``Lease.write_final_and_claim``); otherwise the drain claims it afterwards."""
        lease = self.tools.lease
        ended, found = lease.write_final_and_claim(
            self.claim.turn,
            status=status,
            error=error,
            reply=reply,
            assistant_message_id=new_message_id(),
        )
        if found is not None:
            claim = queueing.fresh_claim(self.claim.agent, lease.token, found)
            lease_of_claim = _lease(self.services, claim, lease.renewed_at)
            self.following = Claimed(claim, lease_of_claim, time.monotonic())
        return ended

    def _final_transaction(
        self, outcome: RunOutcome, status: str, error: str | None
    ) -> tuple[Ended | None, str, str | None]:
        turn = self.claim.turn
        with self._fenced("final") as conn:
            ended = turn_ops.finish_turn(conn, turn, status=status, error=error)
            if ended is None:
                status, error = _stored_ending(conn, turn, status, error)
            if outcome.has_content:
                store_reply(conn, turn, outcome.message, self.tools.lease)
            if outcome.asked and ended is not None:
                asked, reply = outcome.asked, outcome.message
                self.continuation = approvals.hold_place(conn, turn, asked, reply)
            if self.release_with_final:  # a continuation admitted here holds the head
                ended_seq = turn.seq if self.continuation is None else None
                self.released = Released(self.tools.lease.head_after(conn, ended_seq))
            if self.claim_in_transaction:
                self.following = self._claim_following(conn)
        return ended, status, error

    def _claim_following(self, conn: Connection) -> Claimed | NotClaimed:
        """The next turn, claimed in the final write's transaction under the lease it just
        renewed (a NotClaimed "idle" gives the lease back there)."""
        claim, lease = self.claim, self.tools.lease
        agent = AgentRef(claim.agent_id, claim.agent_type, claim.agent_name)
        sent, renewed = lease.renewed_at, lease.held
        following = _claim_in(self.services, conn, agent, sent, token=lease.token, renewed=renewed)
        assert not isinstance(following, queueing.Unsettled)  # a lease renewed settles nothing
        return following

    def _fenced(self, kind: str) -> AbstractContextManager[Connection]:
        lease = self.tools.lease
        return lease.releasing(kind) if self.release_with_final else lease.write(kind)

    def _interrupted(self, ending: Interrupted) -> TurnResult:
        if ending.reason.kind is StopKind.LEASE_LOST:
            self.lost = True
        elif ending.partial is not None:
            self._hand_to_recovery(ending.partial)
        return self.attempt.interrupted(ending)

    def _hand_to_recovery(self, partial: RunOutcome) -> None:
        """A stalled attempt: keep its partial reply and put the turn back for a continuation."""
        turn = self.claim.turn
        try:
            with self.tools.lease.write("stall") as conn:
                if partial.has_content:
                    store_reply(conn, turn, partial.message, self.tools.lease)
                turn_ops.requeue_turn(conn, turn)
        except LeaseLost:
            self.lost = True

    def finish_release(self) -> Released | None:
        """Give the lease back unless it was released with the final write, lost, or kept:
        for the next turn the final write claimed, or for the one the drain claims next —
        unless the process hands its turns over (``engine.handover``), when that one is
        better left to a worker that runs on."""
        if self.tools.lease.released:
            return self.released
        claimed_next = isinstance(self.following, Claimed)
        handing_over = self.services.running.handing_over
        if self.lost or (self.keep_lease and (claimed_next or not handing_over)):
            return None
        ended_seq = self.claim.turn.seq if self.ended and self.continuation is None else None
        return _release(self.tools.lease, self.claim, ended_seq)


def _stored_ending(
    conn: Connection, turn: TurnRecord, status: str, error: str | None
) -> tuple[str, str | None]:
    """The status and error a turn was given meanwhile (a cancellation), instead of ours. A
    row gone meanwhile was cancelled, then deleted (only a finished turn can be): aborted."""
    stored = turn_ops.get_turn_by_id(conn, turn.id)
    if stored is None:
        return Status.ABORTED, DELETED
    if stored.status is not Status.RUNNING:
        return stored.status, stored.error
    return status, error


def _release(lease: Lease, claim: Claim, ended_seq: int | None) -> Released | None:
    try:
        return lease.release(ended_seq=ended_seq)
    except LeaseLost:
        return None
    except ThinkJobsError:
        log.exception("could not release the lease of %s; it will expire", claim.agent_name)
        return None


def _has_turn_hooks(agent: AgentHooks) -> bool:
    """Whether the agent overrides a hook that runs after a turn's final write."""
    return any(agent.overrides(hook) for hook in _TURN_HOOKS)


_TURN_HOOKS = ("on_chat_response", "on_chat_error", "on_submission_status")
