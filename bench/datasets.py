"""Bulk-generated ``think_turns`` datasets (one INSERT ... SELECT), and EXPLAIN of hot queries.

Rows are numbered g = 0..rows-1 in time order (created_at grows with g). Every k-th row belongs
to the measured agent (agent id 1) until it has ``history`` turns; the others go round-robin to
``rows / per_agent`` other agents, so every agent's rows are spread over the whole table as real
traffic would leave them. 2 % of turns are errors; the measured agent's last 3 turns and the
last ``_PENDING_TAIL`` rows of the others are pending; everything else is completed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, event

from bench.services import Scratch

_SPAN_S = 90 * 86_400  # the dataset covers 90 days
_PENDING_TAIL = 100
_MEASURED_PENDING = 3
_TEXT = "Order #%s arrived damaged; please arrange a replacement and confirm by email."


@dataclass(frozen=True)
class Shape:
    rows: int
    history: int
    per_agent: int

    @property
    def others(self) -> int:
        """How many other agents; coprime with ``stride`` so that every one gets rows."""
        count = max(1, (self.rows - self.history) // self.per_agent)
        while math.gcd(count, self.stride) > 1:
            count += 1
        return count

    @property
    def stride(self) -> int:
        """Every ``stride``-th row is the measured agent's."""
        return max(1, self.rows // self.history)

    @property
    def step_s(self) -> int:
        return max(1, _SPAN_S // self.rows)

    def params(self) -> dict[str, int]:
        return {
            "rows": self.rows,
            "history": self.history,
            "others": self.others,
            "stride": self.stride,
            "step": self.step_s,
            "last_pending": self.history - _MEASURED_PENDING,
            "tail": self.rows - _PENDING_TAIL,
        }


# Column expressions shared by both dialects; {g} is the row number, {m} "is measured".
_MEASURED = "({g} % :stride = 0 AND {g} / :stride < :history)"
_SEQ = "CASE WHEN {m} THEN {g} / :stride + 1 ELSE {g} + 1 END"
_AGENT = "CASE WHEN {m} THEN 1 ELSE 2 + {g} % :others END"
_STATUS = (
    "CASE WHEN {m} AND {g} / :stride >= :last_pending THEN 'pending' "
    "WHEN NOT {m} AND {g} >= :tail THEN 'pending' "
    "WHEN (CASE WHEN {m} THEN {g} / :stride ELSE {g} END) % 50 = 7 THEN 'error' "
    "ELSE 'completed' END"
)

_PG_TURNS = """
INSERT INTO think_turns (agent_id, seq, request_id, kind, trigger, status, messages,
    continuation, error, attempt, recoveries, messages_applied, assistant_message_id,
    created_at, started_at, completed_at)
SELECT agent_id, seq, md5(g::text), 'submission', 'submission', status,
    json_build_array(json_build_object('id', 'm' || g, 'role', 'user', 'parts',
        json_build_array(json_build_object('type', 'text', 'text', format(:text, g))))),
    false, CASE WHEN status = 'error' THEN 'model failed' END,
    CASE WHEN status = 'pending' THEN 0 ELSE 1 END, 0, status <> 'pending',
    CASE WHEN status <> 'pending' THEN 'a' || g END,
    created, CASE WHEN status <> 'pending' THEN created + interval '1 second' END,
    CASE WHEN status <> 'pending' THEN created + interval '3 seconds' END
FROM (
    SELECT g, {agent} AS agent_id, {seq} AS seq, {status} AS status,
        timestamptz '2026-01-01 00:00:00+00' + make_interval(secs => g * :step) AS created
    FROM generate_series(0, :rows - 1) AS g
) AS rows
"""

_SQLITE_TURNS = """
INSERT INTO think_turns (agent_id, seq, request_id, kind, trigger, status, messages,
    continuation, error, attempt, recoveries, messages_applied, assistant_message_id,
    created_at, started_at, completed_at)
SELECT agent_id, seq, printf('r%012d', g), 'submission', 'submission', status,
    json_array(json_object('id', 'm' || g, 'role', 'user', 'parts',
        json_array(json_object('type', 'text', 'text', printf(:text, g))))),
    0, CASE WHEN status = 'error' THEN 'model failed' END,
    CASE WHEN status = 'pending' THEN 0 ELSE 1 END, 0, status <> 'pending',
    CASE WHEN status <> 'pending' THEN 'a' || g END,
    datetime(created, 'unixepoch') || '.000000',
    CASE WHEN status <> 'pending' THEN datetime(created + 1, 'unixepoch') || '.000000' END,
    CASE WHEN status <> 'pending' THEN datetime(created + 3, 'unixepoch') || '.000000' END
FROM (
    WITH RECURSIVE numbers(g) AS (SELECT 0 UNION ALL SELECT g + 1 FROM numbers WHERE g + 1 < :rows)
    SELECT g, {agent} AS agent_id, {seq} AS seq, {status} AS status,
        1767225600 + g * :step AS created
    FROM numbers
) AS rows
"""

_AGENTS = """
INSERT INTO think_agents (id, agent_type, agent_name, admitted, created_at)
SELECT n, :agent_type, CASE WHEN n = 1 THEN :measured ELSE 'other-' || n END, 0, :created
FROM ({numbers}) AS numbers
"""
_PG_NUMBERS = "SELECT generate_series(1, :others + 1) AS n"
_SQLITE_NUMBERS = (
    "WITH RECURSIVE ns(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM ns WHERE n <= :others) "
    "SELECT n FROM ns"
)
_ADMITTED = (
    "UPDATE think_agents SET admitted = "
    "COALESCE((SELECT max(seq) FROM think_turns WHERE think_turns.agent_id = think_agents.id), 0)"
)


def _turns_sql(dialect: str) -> str:
    measured = _MEASURED.format(g="g")
    sql = _PG_TURNS if dialect == "postgresql" else _SQLITE_TURNS
    for name, text in (("agent", _AGENT), ("seq", _SEQ), ("status", _STATUS)):
        sql = sql.replace("{" + name + "}", text.format(g="g", m=measured))
    return sql


def fill(run: Scratch, shape: Shape, *, agent_type: str, measured: str) -> int:
    """Insert the agents and turns of ``shape``; returns the measured agent's id (1)."""
    engine = run.jobs.db.engine
    postgres = engine.dialect.name == "postgresql"
    params: dict[str, Any] = {**shape.params(), "text": _TEXT}
    numbers = _PG_NUMBERS if postgres else _SQLITE_NUMBERS
    created = "2026-01-01 00:00:00" + ("+00" if postgres else ".000000")
    with engine.begin() as conn:
        conn.execute(
            sa.text(_AGENTS.format(numbers=numbers)),
            {**params, "agent_type": agent_type, "measured": measured, "created": created},
        )
        with _indexes_rebuilt_after(conn, enabled=postgres):
            conn.execute(sa.text(_turns_sql(engine.dialect.name)), params)
        conn.execute(sa.text(_ADMITTED))
    _analyze(run)
    return 1


_CONSTRAINTS = (
    "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
    "WHERE conrelid = 'think_turns'::regclass AND contype IN ('u', 'f')"
)
_INDEXES = (
    "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'think_turns' "
    "AND indexname <> 'think_turns_pkey' "
    "AND indexname NOT IN (SELECT conname FROM pg_constraint WHERE contype = 'u')"
)


@contextmanager
def _indexes_rebuilt_after(conn: Connection, *, enabled: bool) -> Iterator[None]:
    """PostgreSQL: drop the secondary indexes and constraints of think_turns for a bulk load
    and recreate them, with the same definitions, afterwards (many times faster)."""
    if not enabled:
        yield
        return
    constraints = list(conn.exec_driver_sql(_CONSTRAINTS))
    indexes = list(conn.exec_driver_sql(_INDEXES))
    for name, _ in constraints:
        conn.exec_driver_sql(f'ALTER TABLE think_turns DROP CONSTRAINT "{name}"')
    for name, _ in indexes:
        conn.exec_driver_sql(f'DROP INDEX "{name}"')
    yield
    for name, definition in constraints:
        conn.exec_driver_sql(f'ALTER TABLE think_turns ADD CONSTRAINT "{name}" {definition}')
    for _, definition in indexes:
        conn.exec_driver_sql(definition)


def _analyze(run: Scratch) -> None:
    engine = run.jobs.db.engine
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE")
        return
    with engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE")


class _Recorder:
    """Collects the statements an operation sends (with their parameters)."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, Any]] = []

    def __call__(self, conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        self.statements.append((statement, params))


def explain_plans(run: Scratch, operations: object, *, methods: Sequence[str]) -> None:
    """Print the plan of every statement each operation sends (in a rolled-back transaction)."""
    engine = run.jobs.db.engine
    for method in methods:
        recorder = _Recorder()
        event.listen(engine, "before_cursor_execute", recorder)
        try:
            getattr(operations, method)(0)
        finally:
            event.remove(engine, "before_cursor_execute", recorder)
        print(f"\n#### {method}\n")
        for statement, params in recorder.statements:
            _explain(run, statement, params)


def _explain(run: Scratch, statement: str, params: Any) -> None:
    engine = run.jobs.db.engine
    first = statement.lstrip().split(None, 1)[0].upper()
    if first not in {"SELECT", "UPDATE", "INSERT", "DELETE"}:
        return
    postgres = engine.dialect.name == "postgresql"
    prefix = "EXPLAIN (ANALYZE, BUFFERS) " if postgres else "EXPLAIN QUERY PLAN "
    with engine.connect() as conn:
        transaction = conn.begin()
        try:
            rows = conn.exec_driver_sql(prefix + statement, params).fetchall()
        finally:
            transaction.rollback()
    print("```sql\n" + " ".join(statement.split()) + "\n```\n```")
    print("\n".join(str(row[-1]) for row in rows) + "\n```")
