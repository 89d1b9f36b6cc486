"""Follow-ups: a Celery task message stored with a turn and sent once the turn ends.

A workflow step that waits on a turn stores its own task message as the turn's follow-up and
ends, so its message is acknowledged instead of waiting in a worker's memory (where a killed
worker would leave it unacknowledged until the broker's visibility timeout). The statement
that ends the turn makes the follow-up due; the process that ended it takes it and sends it
right after its commit, and a sweeper sends any that are still due (the sender died first).
Taking one is a conditional UPDATE, so only one process sends it; a follow-up taken but not
confirmed is due again ``FOLLOWUP_RESEND_AFTER_S`` later. A step sent twice (its sender died
between the send and the confirmation) finds its submission by its task id and does nothing
new.
"""

from __future__ import annotations

import logging
from typing import Any

from think_jobs.db import turns as turn_ops
from think_jobs.domain.records import Ended
from think_jobs.engine.ports import Services
from think_jobs.errors import ThinkJobsError

log = logging.getLogger(__name__)

_SWEEP_BATCH = 100


def register(services: Services, turn_id: int, message: dict[str, Any]) -> bool:
    """Store ``message`` (a Celery signature as a dict) to send when the turn ends; False if
    the turn already ended (send nothing: the caller reads the outcome itself)."""
    with services.db.write() as conn:
        return turn_ops.set_followup(conn, turn_id, message)


def send_after_end(services: Services, turn_id: int, ended: Ended | None) -> None:
    """Right after a turn's end was committed: send its follow-up, if it has one."""
    if ended is not None and ended.followup is not None:
        send(services, turn_id)


def send(services: Services, turn_id: int) -> bool:
    """Take the turn's due follow-up and send it; False if there was none to take (another
    process took it) or the broker refused it (it is due again later)."""
    try:
        with services.db.write() as conn:
            message = turn_ops.claim_followup(conn, turn_id)
        if message is None:
            return False
        services.dispatch.send_message(message)
        with services.db.write() as conn:
            turn_ops.followup_sent(conn, turn_id)
    except ThinkJobsError as error:
        log.warning("follow-up of turn %s not sent (will retry): %s", turn_id, error)
        return False
    except Exception as error:  # kombu raises several unrelated types when the broker is down
        log.warning("follow-up of turn %s not sent (will retry): %s", turn_id, error)
        return False
    return True


def send_due(services: Services) -> int:
    """Send every due follow-up (the sweeper); returns how many were sent."""
    with services.db.read() as conn:
        due = turn_ops.due_followups(conn, limit=_SWEEP_BATCH)
    return sum(send(services, turn_id) for turn_id in due)
