"""The agent's lease, as held by one attempt: the fence every write of the attempt goes through.

A lease is a token and an expiry on the agent row (taken by ``queueing.claim_next``). Holding
it is what makes an attempt the one allowed to run the agent's turn — but a lease is not a
lock: the holder may be paused (GC, SIGSTOP, a VM migrated) or cut off for longer than the
lease lasts, then carry on. So every database write made for an attempt starts, in the same
transaction, with a statement on the agent row that only matches while the token is still
ours (``renew_lease``, or ``release_lease`` for the final write that also gives the lease
back). It locks the row until commit, so no other process can take the lease between the
check and the write; when it matches nothing, ``LeaseLost`` is raised and nothing of the
transaction is written. The lease's expiry comes from the database server's clock.

``valid_until`` is this process's own bound (monotonic clock): the lease cannot have been
taken before it, because the database set the expiry ``ttl_s`` after the renewal was sent.
The stream writer asks ``locally_valid()`` before each send and the watch stops the turn when
it turns false — ``safety_s`` before ``valid_until``, so that an attempt that could not renew
(cut off from the database) has stopped before anyone else may start the turn.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from think_jobs.db import agents as agent_ops
from think_jobs.db import final_write
from think_jobs.db import turns as turn_ops
from think_jobs.db.claim import FreshClaim
from think_jobs.db.engine import Connection, Database
from think_jobs.domain.records import Ended, HeadBrief, Released, TurnRecord
from think_jobs.errors import StorageUnavailableError, ThinkJobsError
from think_jobs.observe import metrics

log = logging.getLogger(__name__)

_Found = TypeVar("_Found")


class LeaseLost(ThinkJobsError):
    """The attempt no longer holds the agent's lease: another attempt owns the turn. Nothing
    of the write that raised it was stored."""


@dataclass
class Lease:
    """One attempt's hold on an agent's lease (see the module docstring)."""

    db: Database
    agent_id: int
    token: str
    ttl_s: float
    valid_until: float  # monotonic seconds
    db_now: datetime  # the database server's time at the last renewal
    safety_s: float = 0.0
    released: bool = field(default=False)
    held: agent_ops.Held | None = None  # the last renewal (in the current write, if any)
    renewed_at: float = 0.0  # monotonic time that renewal was sent
    admitted_at_release: int = 0  # the agent's admission count as the release wrote it
    reply_dropped: bool = False  # the turn cleared its own conversation: it stores no reply

    def locally_valid(self) -> bool:
        """False once this process cannot be sure it will still hold the lease a little while
        (``safety_s``): time to stop before anyone else may take it."""
        return not self.released and not self.lapsed

    @property
    def lapsed(self) -> bool:
        """True once the local bound (``safety_s`` before ``valid_until``) has passed."""
        return time.monotonic() >= self.valid_until - self.safety_s

    @contextmanager
    def write(self, kind: str) -> Iterator[Connection]:
        """A write transaction that first renews the lease; raises ``LeaseLost`` (nothing
        written) when the lease is not ours any more. ``kind`` names the write in metrics."""
        sent = time.monotonic()
        with self.db.write() as conn:
            held = agent_ops.renew_lease(conn, self.agent_id, self.token, ttl_s=self.ttl_s)
            if held is None:
                raise self._lost(kind)
            self.db_now, self.held, self.renewed_at = held.now, held, sent
            yield conn
        self.valid_until = sent + self.ttl_s

    @contextmanager
    def releasing(self, kind: str) -> Iterator[Connection]:
        """A write transaction that gives the lease back first (the attempt's last write);
        raises ``LeaseLost`` (nothing written) when the lease is not ours any more."""
        with self.db.write() as conn:
            self._give_back(conn, kind)
            yield conn
        self.released = True

    def write_final(
        self,
        turn: TurnRecord,
        *,
        status: str,
        error: str | None,
        reply: dict[str, Any] | None,
        releasing: bool,
    ) -> Ended | None:
        """The attempt's final write in one statement through the fence (PostgreSQL,
        ``db.final_write``), renewing the lease or, ``releasing``, giving it back; the turn's
        ending (None: a status was set meanwhile). Raises ``LeaseLost`` (nothing written)."""
        ending = final_write.Ending(turn, self.token, self.ttl_s, status, error, reply)
        found, sent = self._final(lambda conn: final_write.write_final(conn, ending, releasing))
        if releasing:
            self.released, self.admitted_at_release = True, found.admitted
        else:
            self._renewed(found, sent)
        return found.ended

    def write_final_and_claim(
        self,
        turn: TurnRecord,
        *,
        status: str,
        error: str | None,
        reply: dict[str, Any] | None,
        assistant_message_id: str,
    ) -> tuple[Ended | None, FreshClaim | None]:
        """``write_final`` renewing the lease, with the agent's next turn claimed in the same
        statement when it can be (``db.final_write.write_final_and_claim``; None: the caller
        claims it). Raises ``LeaseLost`` (nothing written)."""
        ending = final_write.Ending(turn, self.token, self.ttl_s, status, error, reply)
        (written, claimed), sent = self._final(
            lambda conn: final_write.write_final_and_claim(conn, ending, assistant_message_id)
        )
        self._renewed(written, sent)
        return written.ended, claimed

    def _final(self, write: Callable[[Connection], _Found | None]) -> tuple[_Found, float]:
        """``write`` in a statement of its own; what it found, and when it was sent. Raises
        ``LeaseLost`` when it found nothing (the fence did not match: nothing written)."""
        sent = time.monotonic()
        with self.db.statement() as conn:
            found = write(conn)
        if found is None:
            raise self._lost("final")
        return found, sent

    def _renewed(self, written: final_write.FinalWritten, sent: float) -> None:
        assert written.now is not None
        self.held = agent_ops.Held(written.admitted, written.now)
        self.db_now, self.renewed_at, self.valid_until = written.now, sent, sent + self.ttl_s

    def heartbeat(self, turn_id: int) -> TurnRecord | None:
        """Renew the lease and read the turn (a cancel that found Redis down shows here).
        On PostgreSQL one statement in autocommit (``agent_ops.renew_reading_turn``): the
        write a running turn makes most often holds the agent's row for no longer than the
        statement, whatever happens to this process around it. Raises ``LeaseLost``, or
        ``StorageUnavailableError`` when the database is out of reach."""
        if not self.db.one_statement_writes:
            with self.write("heartbeat") as conn:
                return turn_ops.get_turn_by_id(conn, turn_id)
        sent = time.monotonic()
        with self.db.statement() as conn:
            found = agent_ops.renew_reading_turn(
                conn, self.agent_id, self.token, ttl_s=self.ttl_s, turn_id=turn_id
            )
        if found is None:
            raise self._lost("heartbeat")
        held, turn = found
        self.db_now, self.held, self.renewed_at = held.now, held, sent
        self.valid_until = sent + self.ttl_s
        return turn

    def release(self, *, ended_seq: int | None) -> Released:
        """Give the lease back and return the agent's new head (``head_after``); raises
        ``LeaseLost`` when it was not ours any more. On PostgreSQL the release is one statement
        in autocommit (its count of admissions comes from the row it locked, not from a
        snapshot), followed by the head's read only when a turn may wait (``next_head``)."""
        if not self.db.one_statement_writes:
            with self.releasing("release") as conn:
                return Released(self.head_after(conn, ended_seq))
        with self.db.statement() as conn:
            self._give_back(conn, "release")
        self.released = True
        return self.next_head(ended_seq)

    def head_after(self, conn: Connection, ended_seq: int | None) -> HeadBrief | None:
        """The agent's head once the lease was given back in ``conn``'s transaction: none when
        no turn was admitted after ``ended_seq``, the turn this lease just ended (every turn
        before it had ended), else read. ``ended_seq`` None: the lease's turn may still be
        active (handed back to recovery), so the head is always read."""
        if self._nothing_waits(ended_seq):
            return None
        return turn_ops.head_brief(conn, self.agent_id)

    def next_head(self, ended_seq: int | None) -> Released:
        """``head_after`` for a release that was a statement of its own: the head is read in
        another one, only when a turn may wait. The lease is already given back, so a database
        that went away meanwhile does not fail the turn (its ending is stored; its stream's end,
        hooks and follow-ups are still to come): the head is then ``head_unread``."""
        if self._nothing_waits(ended_seq):
            return Released(None)
        try:
            with self.db.statement() as conn:
                return Released(turn_ops.head_brief(conn, self.agent_id))
        except StorageUnavailableError as error:
            log.warning(
                "gave back the lease of agent row %d but could not read its next turn (%s): "
                "nudging a drain to look",
                self.agent_id, error,
            )  # fmt: skip
            return Released(None, head_unread=True)

    def _nothing_waits(self, ended_seq: int | None) -> bool:
        return ended_seq is not None and self.admitted_at_release <= ended_seq

    def _give_back(self, conn: Connection, kind: str) -> None:
        admitted = agent_ops.release_lease(conn, self.agent_id, self.token)
        if admitted is None:
            raise self._lost(kind)
        self.admitted_at_release = admitted

    def _lost(self, kind: str) -> LeaseLost:
        metrics.FENCED_WRITES.labels(kind).inc()
        self.valid_until = 0.0
        return LeaseLost(
            f"the agent's lease (agent row {self.agent_id}) was lost before a {kind} write"
        )
