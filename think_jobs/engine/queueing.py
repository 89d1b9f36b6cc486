"""Admission and claims: where per-agent FIFO and mutual exclusion come from.

Ordering lives in the database, not in Redis or Celery:

- **Admission** increments the agent row's ``admitted`` counter (locking the row until commit)
  and stores the turn with that number as ``seq`` (on PostgreSQL a submission usually in one
  statement, guarded so that it sees what the two-statement path would: ``db.admission``).
  Numbers are therefore handed out in commit order per agent, and two admissions with the
  same idempotency key serialise on the row.
- **Claim**: a process may run a turn only while it holds the agent's lease
  (``lease_token``, ``lease_expires_at``), taken with a conditional UPDATE. The turn it runs
  is always the agent's head: the lowest ``seq`` that is pending or running. A running head
  found by a new lease holder was orphaned by a dead executor and goes to recovery first.
  The common case, a submission at the head not yet begun, is started by one conditional
  UPDATE that finds the head and marks it running (``turns.start_fresh_head``); on
  PostgreSQL the whole claim of it (lease, start, messages, conversation) is one statement
  when nobody changed the agent row meanwhile (``claim_fresh``, ``db.claim``). A head that
  waits for a tool call's approval (``awaiting_approval``, see ``engine.approvals``) is not
  claimed: the lease is given back and the turns behind it wait.
- **Release** frees the lease and reads the admission count from the row it locked, so a turn
  admitted at that instant is never stranded: when one was admitted after the turn just ended,
  the releaser reads the new head and enqueues a drain for it (worker turns) or wakes the
  waiting caller (blocking turns); ``engine.lease`` does it.

Whether a lease is live is decided by the database server's clock, inside the statements
(``db_now``), never by the clock of the process asking. What an attempt writes while it holds
the lease goes through ``think_jobs.engine.lease`` (the fence).

Celery only carries "look at agent N" messages (``think_jobs.drain``); a lost or duplicated
message can delay a turn but never reorder or double-run one.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, replace
from datetime import datetime

from think_jobs.db import admission as admission_ops
from think_jobs.db import agents as agent_ops
from think_jobs.db import claim as claim_ops
from think_jobs.db import conversation as conversation_ops
from think_jobs.db import turns as turn_ops
from think_jobs.db.engine import Connection
from think_jobs.domain import policy
from think_jobs.domain.records import (
    Admission,
    AgentRef,
    Claim,
    Idle,
    NewTurn,
    NotClaimed,
    TurnRecord,
)
from think_jobs.domain.status import Kind, Status
from think_jobs.messages import new_message_id, unappliable_reason

log = logging.getLogger(__name__)

REGENERATE = "regenerate"  # a submission whose turn replaces the agent's last reply
_MAX_STALE_HEADS = 100

__all__ = [
    "REGENERATE",
    "Admission",
    "AgentRef",
    "Claim",
    "NotClaimed",
    "Unsettled",
    "admit",
    "admit_at_tail",
    "admit_submission",
    "claim_fresh",
    "claim_next",
    "existing_submission",
]


def admit(
    conn: Connection, agent_id: int, new: NewTurn, *, admitted: agent_ops.Admitted | None = None
) -> Admission:
    """Store a new turn at the tail of the agent's queue.

    ``is_head`` says whether someone must be nudged: not if the agent's lease is held (its
    holder hands on when it releases), not if older turns wait (their nudge comes first).
    """
    admitted = admitted or agent_ops.next_admission(conn, agent_id)
    inserted = turn_ops.insert_turn(conn, agent_id=agent_id, seq=admitted.seq, new=new)
    is_head = inserted.is_head and not admitted.lease_held
    return Admission(inserted.turn, accepted=True, is_head=is_head)


def admit_at_tail(conn: Connection, agent_id: int, new: NewTurn) -> Admission | None:
    """``admit_submission``'s common case in one statement (PostgreSQL, ``db.admission``): it
    goes ahead only when nothing changed the agent row since its snapshot and no turn has the
    ids of ``new``, and writes nothing otherwise (None: ``admit_submission`` must run)."""
    at_tail = admission_ops.admit_at_tail(conn, agent_id, new)
    if at_tail is None:
        return None
    return Admission(at_tail.turn, accepted=True, is_head=at_tail.is_head)


def admit_submission(
    conn: Connection, agent_id: int, new: NewTurn, *, submission_id: str | None
) -> Admission:
    """Admit a durable submission, or return the one these ids already name (accepted=False;
    ``submission_id`` is the id the caller gave, if any)."""
    admitted = agent_ops.next_admission(conn, agent_id)  # locks the row: duplicates serialise
    existing = existing_submission(conn, agent_id, new, submission_id=submission_id)
    if existing is not None:
        return existing
    return admit(conn, agent_id, new, admitted=admitted)


def existing_submission(
    conn: Connection, agent_id: int, new: NewTurn, *, submission_id: str | None
) -> Admission | None:
    """The stored submission the ids of ``new`` name (accepted=False), or None; raises
    ``SubmissionConflictError`` when they name different turns. A turn it finds is committed,
    so answering a duplicate needs no lock: only admitting a new turn does."""
    key = new.idempotency_key
    if submission_id is None and key is None:
        return None
    found = turn_ops.find_by_request_or_key(conn, agent_id, submission_id, key)
    existing = policy.existing_submission(found, submission_id, key)
    return None if existing is None else Admission(existing, accepted=False, is_head=False)


def claim_next(
    conn: Connection,
    agent: AgentRef,
    *,
    lease_ttl_s: float,
    max_recoveries: int,
    caller_turn_id: int | None = None,
    held_token: str | None = None,
    renewed: agent_ops.Held | None = None,
    settle_lapsed: bool = False,
) -> Claim | NotClaimed | Unsettled:
    """Take the agent's lease and start its head turn, all in ``conn``'s transaction.

    ``caller_turn_id`` is the blocking turn of the calling process, which it may run; any
    process may run a durable submission at the head (callers help drain what is ahead of
    them, so a blocking call never depends on a free worker slot). ``held_token`` continues
    with a lease this process kept from its previous turn (renewed, not taken again);
    ``renewed`` is that renewal when it was already made in ``conn``'s transaction. With
    ``settle_lapsed``, a lease taken over from a holder whose lease lapsed, from under a turn
    cancelled meanwhile, is kept without starting a turn (``Unsettled``, see ``_unsettled``).
    """
    token = held_token or uuid.uuid4().hex
    if renewed is not None or held_token is not None:
        held = renewed or agent_ops.renew_lease(conn, agent.id, token, ttl_s=lease_ttl_s)
    else:
        taken = agent_ops.take_lease(conn, agent.id, token, ttl_s=lease_ttl_s)
        held = None if taken is None else taken.held
        if taken is not None and taken.lapsed and settle_lapsed:
            unsettled = _unsettled(conn, agent.id, token)
            if unsettled is not None:
                return unsettled
    if held is None:
        return NotClaimed(Idle.BUSY)
    holder = _Holder(agent, token, held.admitted, held.now)
    fresh = turn_ops.start_fresh_head(conn, agent.id, assistant_message_id=new_message_id())
    if fresh is not None and not _unappliable(conn, fresh):
        return _started(conn, fresh, holder, recovering=False, applying=True)
    for _ in range(_MAX_STALE_HEADS):
        head = turn_ops.head_turn(conn, agent.id)
        if head is None:
            agent_ops.release_lease(conn, agent.id, token)
            return NotClaimed(Idle.IDLE)
        outcome = _claim_head(conn, head, holder, max_recoveries, caller_turn_id)
        if outcome is not None:
            if isinstance(outcome, NotClaimed):
                agent_ops.release_lease(conn, agent.id, token)
            return outcome
    agent_ops.release_lease(conn, agent.id, token)
    return NotClaimed(Idle.BUSY)


def claim_fresh(
    conn: Connection, agent: AgentRef, *, held_token: str | None, lease_ttl_s: float
) -> Claim | str | None:
    """``claim_next``'s common case in one statement (PostgreSQL, ``db.claim``): the agent's
    head is a submission not begun. A ``Claim`` (with the conversation read), or the token of
    the lease it took without starting a turn (``claim_next`` goes on with it), or None when
    it wrote nothing (``claim_next`` must run)."""
    token = held_token or uuid.uuid4().hex
    found = claim_ops.claim_fresh_head(
        conn,
        agent.id,
        token=token,
        renewing=held_token is not None,
        ttl_s=lease_ttl_s,
        assistant_message_id=new_message_id(),
    )
    if found is None:
        return None
    if found.turn is None:
        return token
    return fresh_claim(agent, token, found)


def fresh_claim(agent: AgentRef, token: str, found: claim_ops.FreshClaim) -> Claim:
    """The claim of a turn a one-statement claim started (``found.turn`` set), with the
    conversation it read."""
    assert found.turn is not None
    holder = _Holder(agent, token, found.admitted, found.now)
    return replace(holder.claim(found.turn, recovering=False), history=found.history)


@dataclass(frozen=True)
class Unsettled:
    """A lease taken over from a holder whose lease lapsed while the agent's last turn
    (``turn``) was cancelled under it. That turn's attempt died, or was paused or cut off,
    and can write no more (its writes are fenced); no recovery follows a cancel, so what it
    streamed since its last stored partial is stored by the new holder, before the agent's
    next turn applies its messages. The claim keeps the lease (``token``) and starts nothing:
    its caller commits, stores the partial under the lease (``engine.settle``: Redis is read
    with no transaction open, then one fenced write), then claims again with ``token``."""

    token: str
    turn: TurnRecord


def _unsettled(conn: Connection, agent_id: int, token: str) -> Unsettled | None:
    """The take-over's ``Unsettled``, if the agent's last applied turn was cancelled.

    The turn is read locked: a cancel committing as the lease is taken over is either read
    here, or waits until this claim has started the turn's recovery (which a cancel stops
    as it stops any attempt). Read unlocked, a cancel committing between this read and the
    look for the head left the turn aborted with its stream's partial unstored and the next
    turn started after it (seen in the mixed-faults bench, seed 710321)."""
    last = turn_ops.last_applied(conn, agent_id)
    if last is None or last.status is not Status.ABORTED:
        return None
    return Unsettled(token, last)


@dataclass(frozen=True)
class _Holder:
    """The lease just taken: its token, the admission count and the database's time then."""

    agent: AgentRef
    token: str
    admitted: int
    now: datetime

    def claim(self, turn: TurnRecord, *, recovering: bool) -> Claim:
        agent = self.agent
        return Claim(
            agent.id,
            agent.agent_type,
            agent.agent_name,
            self.token,
            turn,
            recovering,
            self.admitted,
            self.now,
        )


def _claim_head(
    conn: Connection,
    head: TurnRecord,
    holder: _Holder,
    max_recoveries: int,
    caller_turn_id: int | None,
) -> Claim | NotClaimed | None:
    """Claim ``head``, or say why not; None means "the head changed, look again"."""
    if head.awaiting_approval:  # a continuation holding its place until a human answers
        return NotClaimed(Idle.APPROVAL, head)
    if head.status is Status.RUNNING:
        return _recover_orphan(conn, head, holder, max_recoveries)
    if head.kind is Kind.BLOCKING and head.id != caller_turn_id and not head.messages_applied:
        if head.caller_expires_at is not None and head.caller_expires_at < holder.now:
            turn_ops.end_turn(conn, head.id, status=Status.ABORTED, error=policy.CALLER_GONE)
            return None
        return NotClaimed(Idle.CALLER, head)
    if head.messages_applied:  # handed to recovery by a stalled attempt
        return _recover_orphan(conn, head, holder, max_recoveries)
    if _unappliable(conn, head):
        return None
    return _start(conn, head, holder, recovering=False)


def _unappliable(conn: Connection, head: TurnRecord) -> bool:
    """A submission whose stored messages cannot join the conversation ends in error, not run
    (True): one bad row must not stop the agent's queue."""
    if not head.is_submission or head.trigger == REGENERATE:
        return False
    reason = unappliable_reason(head.messages)
    if reason is None:
        return False
    log.error("submission %s not run: %s", head.request_id, reason)
    turn_ops.end_turn(
        conn, head.id, status=Status.ERROR, error=policy.UNAPPLIABLE.format(reason=reason)
    )
    return True


def _recover_orphan(
    conn: Connection, head: TurnRecord, holder: _Holder, max_recoveries: int
) -> Claim | None:
    plan = policy.plan_for_orphan(head, max_recoveries=max_recoveries)
    if plan == "requeue":
        turn_ops.requeue_turn(conn, head)
        return None
    if plan == "continue":
        return _start(conn, head, holder, recovering=True)
    turn_ops.end_turn(conn, head.id, status=Status.ERROR, error=plan)
    return None


def _start(
    conn: Connection, head: TurnRecord, holder: _Holder, *, recovering: bool
) -> Claim | None:
    """Start a new attempt of ``head`` (None: it changed since it was read, look again)."""
    applying = head.is_submission and not head.messages_applied
    turn = turn_ops.start_attempt(
        conn,
        head,
        assistant_message_id=new_message_id(),
        recovering=recovering,
        applying=applying,
    )
    if turn is None:
        return None
    return _started(conn, turn, holder, recovering=recovering, applying=applying)


def _started(
    conn: Connection, turn: TurnRecord, holder: _Holder, *, recovering: bool, applying: bool
) -> Claim:
    """A submission's messages join the conversation as its first attempt starts (a
    ``regenerate`` submission removes the last reply instead); the body a turn brings becomes
    the agent's remembered body."""
    if applying and turn.trigger == REGENERATE:
        conversation_ops.delete_last_reply(conn, turn.agent_id)
    elif applying:
        messages = turn.messages or []
        conversation_ops.append_messages(
            conn, turn.agent_id, messages, turn_id=turn.id, now=holder.now
        )
    if turn.body is not None:
        agent_ops.set_last_body(conn, turn.agent_id, turn.body)
    return holder.claim(turn, recovering=recovering)
