"""The common claim in one statement (PostgreSQL): lease, start the head, apply, read.

The general path (``queueing.claim_next``) is a transaction of four statements: it takes the
lease first, locking the agent row, so that the statements after it see every transaction
that held the row before (a turn finished and released just before, the reply it stored).
One statement has one snapshot, taken *before* it waits for the row lock, so this one goes
ahead only when nobody changed the agent row between its snapshot and its lock (the ``xmin``
guard of ``db.admission``: a release, an admission or a claim changes it), and only for the
common case: the head is a pending submission whose messages are not applied yet, waiting
for no approval, bringing no body to remember, not a ``regenerate``, holding no NUL
(PostgreSQL's ``->>`` cannot turn a JSON text with ``\\u0000`` anywhere into text), and
whose messages all have an id and a role the general path would apply: any other head, and
any row PostgreSQL refuses to take apart, goes the general path, which decides in Python
(``messages.unappliable_reason``). Then, in one round trip:

- ``fresh``: the agent's head in the snapshot, if it is such a submission;
- ``leased``: the lease taken (free; ``renewing``: still ours), only under the guard and
  with a fresh head (a lapsed lease goes the general path);
- ``started``: the head marked running for its first attempt, only if leased and still
  pending (a cancellation that committed meanwhile wins);
- ``applied``: the head's messages appended to the conversation in their order (a message
  whose id is stored already is skipped, as ``conversation.append_messages`` does);
- the conversation the model will see: the snapshot's rows, then those just applied.

Run in autocommit: the statement is its own transaction. When it found nothing to do, nothing
is written and the caller takes the general path; when it took the lease but could not start
the head, the caller goes on with the lease it now holds (the general path, renewing it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Connection, Text, column, exc, text
from sqlalchemy.sql.elements import TextClause
from sqlalchemy.sql.selectable import TextualSelect
from sqlalchemy.types import TypeEngine

from think_jobs.db.tables import UTCDateTime, turns
from think_jobs.db.turns import record_of_row
from think_jobs.domain.records import TurnRecord
from think_jobs.limits import ID_MAX_CHARS
from think_jobs.messages import ROLES

log = logging.getLogger(__name__)

TURN_COLUMNS = ", ".join(f's."{column.name}"' for column in turns.c)
_HEAD = """
    SELECT h.id FROM (
        (SELECT id, seq FROM think_turns
         WHERE agent_id = :agent_id AND status = 'pending' ORDER BY seq LIMIT 1)
        UNION ALL
        (SELECT id, seq FROM think_turns
         WHERE agent_id = :agent_id AND status = 'running'{not_ending} ORDER BY seq LIMIT 1)
    ) AS h ORDER BY h.seq LIMIT 1"""
# The parts after ``leased`` (a CTE returning the lease's ``admitted`` and ``now``), shared
# with ``db.final_write``'s statement that also claims the next turn.
FRESH = """fresh AS (
    SELECT t.id FROM think_turns AS t
    WHERE t.id = ({head})
      AND t.status = 'pending' AND t.kind = 'submission' AND NOT t.messages_applied
      AND NOT t.awaiting_approval AND t."trigger" <> 'regenerate'
      AND (t.body IS NULL OR json_typeof(t.body) = 'null')
      AND strpos(t.messages::text, {nul}) = 0
      AND (t.messages IS NULL OR json_typeof(t.messages) IN ('array', 'null'))
      AND NOT EXISTS ({unappliable}){guard}
)"""
STARTED = """started AS (
    UPDATE think_turns AS t
    SET status = 'running',
        attempt = t.attempt + 1,
        started_at = COALESCE(t.started_at, clock_timestamp()),
        assistant_message_id = COALESCE(t.assistant_message_id, :new_message_id),
        messages_applied = true
    FROM leased
    WHERE t.id = (SELECT id FROM fresh) AND t.status = 'pending' AND NOT t.messages_applied
    RETURNING t.*
), applied AS (
    INSERT INTO think_messages (agent_id, message_id, role, data, turn_id, created_at)
    SELECT s.agent_id, m.value ->> 'id', m.value ->> 'role', m.value, s.id, l.now
    FROM started AS s
    CROSS JOIN leased AS l
    CROSS JOIN LATERAL json_array_elements(
        CASE json_typeof(s.messages) WHEN 'array' THEN s.messages ELSE '[]' END
    ) WITH ORDINALITY AS m(value, n)  -- a continuation brings no messages (JSON null)
    {after}ORDER BY m.n
    ON CONFLICT DO NOTHING
    RETURNING id, data
)"""
# The conversation the started turn's model will see: ``stored`` (the snapshot's rows, with
# what the statement wrote before the turn's messages), then those just applied.
HISTORY = """(SELECT COALESCE('[' || string_agg(c.data::text, ',' ORDER BY c.id) || ']', '[]')
     FROM ({stored} UNION ALL SELECT id, data FROM applied) AS c)"""
SNAPSHOT_ROWS = "SELECT id, data FROM think_messages WHERE agent_id = :agent_id"
_SQL = f"""
WITH {{fresh}}, leased AS (
    UPDATE think_agents AS a
    SET lease_token = :token,
        lease_expires_at =
            clock_timestamp() + make_interval(secs => CAST(:ttl_s AS DOUBLE PRECISION))
    WHERE a.id = :agent_id
      AND a.xmin = (SELECT xmin FROM think_agents WHERE id = :agent_id)
      AND {{lease}}
      AND EXISTS (SELECT 1 FROM fresh)
    RETURNING a.admitted, clock_timestamp() AS now
), {{started}}
SELECT {TURN_COLUMNS}, l.admitted AS claim_admitted, l.now AS claim_now,
    {HISTORY.format(stored=SNAPSHOT_ROWS)} AS claim_history
FROM leased AS l LEFT JOIN started AS s ON true
"""
# A message the general path would refuse to apply (``messages.unappliable_reason``): that
# path decides, and ends the turn in error. (What this cannot tell is left to it too.)
_UNAPPLIABLE = f"""
    SELECT 1 FROM json_array_elements(
        CASE json_typeof(t.messages) WHEN 'array' THEN t.messages ELSE '[]' END) AS e(v)
    WHERE json_typeof(v) IS DISTINCT FROM 'object'
       OR json_typeof(v -> 'id') IS DISTINCT FROM 'string'
       OR (v ->> 'role') IS NULL OR (v ->> 'role') NOT IN ({", ".join(f"'{r}'" for r in ROLES)})
       OR length(v ->> 'id') NOT BETWEEN 1 AND {ID_MAX_CHARS} OR (v ->> 'id') ~ '[[:cntrl:]]'"""
_NUL = "chr(92) || 'u0000'"  # the JSON escape of NUL, which ->> cannot turn into text
# Only a free lease: one that lapsed goes the general path, which looks after the turn its
# holder ran (``queueing.Unsettled``).
_FREE = "a.lease_token IS NULL"
_OURS = "a.lease_token = :token"
_TYPES: dict[str, TypeEngine[Any]] = {
    "claim_admitted": BigInteger(),
    "claim_now": UTCDateTime(),
    "claim_history": Text(),
}


def fresh_cte(*, not_ending: str = "", guard: str = "") -> str:
    """The ``fresh`` CTE: the agent's head if it is a submission the statement can start;
    ``not_ending`` excludes a running turn from the head, ``guard`` adds a condition."""
    head = _HEAD.format(not_ending=not_ending)
    return FRESH.format(head=head, nul=_NUL, unappliable=_UNAPPLIABLE, guard=guard)


def with_turn_columns(clause: TextClause, after: dict[str, TypeEngine[Any]]) -> TextualSelect:
    """``clause`` selecting the turn's columns in order (``TURN_COLUMNS``), then ``after``'s
    in their order: every column given by position, so SQLAlchemy matches them by position
    and caches the result's metadata with the compiled statement (given partly by name, it
    read the cursor's description again on every execution: ~110 µs of CPU each here)."""
    named = [column(name, type_) for name, type_ in after.items()]
    return clause.columns(*turns.c, *named)


def _statement(lease: str) -> TextualSelect:
    """The statement for one lease condition; its first columns are the turn's, in order."""
    sql = _SQL.format(fresh=fresh_cte(), lease=lease, started=STARTED.format(after=""))
    return with_turn_columns(text(sql), _TYPES)


_TAKE, _RENEW = _statement(_FREE), _statement(_OURS)


@dataclass(frozen=True)
class FreshClaim:
    """What the statement did: the lease is held (its admission count and the database's time
    as it was written); ``turn`` is the head it started, with ``history`` the conversation
    (None: the head could not be started, the caller holds the lease without a turn)."""

    admitted: int
    now: datetime
    turn: TurnRecord | None
    history: str | None


def claim_fresh_head(
    conn: Connection,
    agent_id: int,
    *,
    token: str,
    renewing: bool,
    ttl_s: float,
    assistant_message_id: str,
) -> FreshClaim | None:
    """Claim the agent's fresh head in one statement (``conn`` in autocommit, PostgreSQL);
    None when nothing was written (the general path must run)."""
    values = {
        "agent_id": agent_id,
        "token": token,
        "ttl_s": ttl_s,
        "new_message_id": assistant_message_id,
    }
    try:
        row = conn.execute(_RENEW if renewing else _TAKE, values).one_or_none()
    except (exc.DataError, exc.IntegrityError) as error:
        # Stored messages PostgreSQL cannot take apart (a row a manual edit or an older
        # version left): nothing was written; the general path reads them in Python.
        log.warning("claim of agent row %s left to the general path: %s", agent_id, error.orig)
        return None
    if row is None:
        return None
    fields = row._mapping
    if fields["id"] is None:
        return FreshClaim(int(fields["claim_admitted"]), fields["claim_now"], None, None)
    turn = record_of_row({column.name: fields[column.name] for column in turns.c})
    return FreshClaim(
        int(fields["claim_admitted"]), fields["claim_now"], turn, fields["claim_history"]
    )
