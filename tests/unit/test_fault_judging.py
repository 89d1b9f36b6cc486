"""The fault tests' judge on journals written by hand: which overlaps of two model calls of one
agent are the product's fault, and which are a frozen attempt that had already lost its turn."""

from __future__ import annotations

from typing import Any

from tests.support.faults import Report, _check_order, _runs, zombie_tails

A, B = 101, 202  # two worker processes


class Journal:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def add(self, what: str, pid: int, **fields: Any) -> None:
        self.events.append({"what": what, "pid": pid, "tick": len(self.events) + 1, **fields})

    def call(self, what: str, pid: int, label: str = "x#1") -> None:
        self.add(what, pid, agent="x", label=label)

    def pause(self, pid: int, seconds: float, lease_ttl_s: float = 2.0) -> None:
        self.add("stopped", pid, t=1000.0, lease_ttl_s=lease_ttl_s)
        self.add("resumed", pid, t=1000.0 + seconds)


def overlaps(journal: Journal) -> int:
    report = Report("hand-written")
    _check_order("x", _runs(journal.events)["x"], ["x#1"], report)
    return report.overlaps


def test_a_takeover_during_a_stop_past_the_lease_is_no_overlap() -> None:
    journal = Journal()
    journal.call("start", A)
    journal.add("stopped", A, t=1000.0, lease_ttl_s=2.0)
    journal.call("start", B)  # the lease lapsed: B takes the turn over
    journal.add("resumed", A, t=1006.0)
    journal.call("end", A)
    journal.call("end", B)
    assert overlaps(journal) == 0


def test_a_takeover_after_the_resume_of_a_stop_past_the_lease_is_no_overlap() -> None:
    """The other worker's slots were busy through the stop: it took the turn over only after
    the frozen one resumed, which had lost it at the stop all the same (CI's failure)."""
    journal = Journal()
    journal.call("start", A)
    journal.pause(A, 6.0)
    journal.call("start", B)
    journal.call("end", A)  # the resumed call noticed at its next chunk
    journal.call("end", B)
    assert overlaps(journal) == 0


def test_a_takeover_after_a_stop_shorter_than_the_lease_is_an_overlap() -> None:
    journal = Journal()
    journal.call("start", A)
    journal.pause(A, 0.5)  # the lease still held: nobody may take the turn
    journal.call("start", B)
    journal.call("end", A)
    journal.call("end", B)
    assert overlaps(journal) == 1


def test_an_overlap_without_a_stop_is_an_overlap() -> None:
    journal = Journal()
    journal.call("start", A)
    journal.call("start", B)
    journal.call("end", A)
    journal.call("end", B)
    assert overlaps(journal) == 1


def test_chunks_a_superseded_call_yields_after_the_resume_are_its_tail() -> None:
    journal = Journal()
    journal.call("start", A)
    journal.call("chunk", A)
    journal.pause(A, 6.0)
    journal.call("start", B)  # took the turn over after the resume
    journal.call("chunk", A)
    journal.call("chunk", A)
    journal.call("end", A)
    journal.call("start", A, label="x#2")  # the same process, later: not a tail
    journal.call("chunk", A, label="x#2")
    journal.call("end", B)
    assert zombie_tails(journal.events) == [2]


def test_a_call_whose_lease_nobody_took_may_go_on_after_the_resume() -> None:
    """It renewed its lease through the fence: going on is right, not a tail."""
    journal = Journal()
    journal.call("start", A)
    journal.pause(A, 6.0)
    for _ in range(5):
        journal.call("chunk", A)
    journal.call("end", A)
    journal.call("start", B, label="x#2")  # the next turn, after it ended
    assert zombie_tails(journal.events) == []
    assert overlaps(journal) == 0


def test_a_short_stop_leaves_no_tail_to_judge() -> None:
    journal = Journal()
    journal.call("start", A)
    journal.pause(A, 0.5)
    journal.call("start", B)
    journal.call("chunk", A)
    journal.call("end", A)
    journal.call("end", B)
    assert zombie_tails(journal.events) == []


def test_a_takeover_journalled_before_the_stop_but_after_the_signal_is_no_overlap() -> None:
    """The test process may be slow to see the worker frozen: another worker can take the
    turn over before ``stopped`` is written, never before ``stopping`` (just before the
    signal)."""
    journal = Journal()
    journal.call("start", A)
    journal.add("stopping", A, t=1000.0)
    journal.call("start", B)  # the lease lapsed while this process waited for the freeze
    journal.add("stopped", A, t=1003.0, lease_ttl_s=2.0)
    journal.add("resumed", A, t=1006.0)
    journal.call("end", A)
    journal.call("end", B)
    assert overlaps(journal) == 0


def test_a_takeover_before_the_signal_is_an_overlap() -> None:
    journal = Journal()
    journal.call("start", A)
    journal.call("start", B)  # the lease lapsed with no fault to explain it
    journal.add("stopping", A, t=1000.0)
    journal.add("stopped", A, t=1000.0, lease_ttl_s=2.0)
    journal.add("resumed", A, t=1006.0)
    journal.call("end", A)
    journal.call("end", B)
    assert overlaps(journal) == 1


def test_a_call_started_between_the_signal_and_the_freeze_is_judged_frozen() -> None:
    journal = Journal()
    journal.add("stopping", A, t=1000.0)
    journal.call("start", A)  # got in before the signal landed
    journal.add("stopped", A, t=1000.0, lease_ttl_s=2.0)
    journal.call("start", B)
    journal.add("resumed", A, t=1006.0)
    journal.call("end", A)
    journal.call("end", B)
    assert overlaps(journal) == 0
