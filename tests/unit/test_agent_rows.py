"""The process's bounded memory of agent rows (``domain.agent_rows``)."""

from __future__ import annotations

import pytest

from think_jobs.domain.agent_rows import AgentRows


def test_a_pair_is_remembered_both_ways() -> None:
    rows = AgentRows(capacity=4)
    rows.remember(7, ("Support", "a"))
    assert rows.id_of(("Support", "a")) == 7
    assert rows.key_of(7) == ("Support", "a")
    assert rows.id_of(("Support", "b")) is None and rows.key_of(8) is None


def test_the_least_recently_used_pairs_are_forgotten_beyond_capacity() -> None:
    rows = AgentRows(capacity=2)
    rows.remember(1, ("T", "one"))
    rows.remember(2, ("T", "two"))
    assert rows.id_of(("T", "one")) == 1  # used: "two" is now the least recent by key
    assert rows.key_of(1) == ("T", "one")  # ... and by id
    rows.remember(3, ("T", "three"))
    assert len(rows) == 2
    assert rows.id_of(("T", "two")) is None and rows.key_of(2) is None
    assert rows.id_of(("T", "one")) == 1 and rows.key_of(3) == ("T", "three")


def test_a_million_agents_keep_it_at_its_capacity() -> None:
    rows = AgentRows(capacity=1000)
    for n in range(1_000_000):
        rows.remember(n, ("T", str(n)))
    assert len(rows) == 1000
    assert rows.key_of(999_999) == ("T", "999999") and rows.key_of(0) is None


def test_a_capacity_under_one_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity must be at least 1, got 0"):
        AgentRows(capacity=0)
