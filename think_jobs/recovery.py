"""What to do with a turn whose executor vanished (its lease expired while it was running).

- Messages never applied: nothing happened that anyone can see, so the turn goes back to
  ``pending`` and runs normally.
- Messages applied: the partial assistant output is recovered from the stream's replay buffer
  and a continuation attempt finishes the reply, at most ``recovery_max_attempts`` times.
- Otherwise the turn ends ``error`` with one of the messages below.
"""

from __future__ import annotations

from typing import Literal

from think_jobs.db.turns import TurnRecord

INTERRUPTED_AFTER_APPLIED = "Submission was interrupted after messages were applied."
INTERRUPTED_PARTIALLY_APPLIED = "Submission was interrupted after messages were partially applied."

Plan = Literal["requeue", "continue"] | str


def plan_for_orphan(turn: TurnRecord, *, max_recoveries: int) -> Plan:
    """``"requeue"``, ``"continue"``, or the error text the turn must end with."""
    if not turn.messages_applied:
        return "requeue"
    if turn.recoveries >= max_recoveries:
        return INTERRUPTED_AFTER_APPLIED
    return "continue"
