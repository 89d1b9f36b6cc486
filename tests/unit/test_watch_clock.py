"""The one thread that wakes every running attempt's watch when it is due (``WatchClock``)."""

from __future__ import annotations

import threading
import time

from tests.support.builders import wait_until
from think_jobs.engine.watch import WatchClock


class Counting:
    """Ticks ``times`` times, ``every_s`` apart, noting when each tick came."""

    def __init__(self, times: int, every_s: float, log: list[tuple[str, float]], name: str):
        self.left, self.every_s, self.log, self.name = times, every_s, log, name
        self.done = threading.Event()

    def tick(self) -> float | None:
        self.log.append((self.name, time.monotonic()))
        self.left -= 1
        if self.left == 0:
            self.done.set()
            return None
        return time.monotonic() + self.every_s


def test_each_watch_is_woken_when_due_and_again_when_it_asks_until_it_asks_no_more() -> None:
    clock, log = WatchClock(), list[tuple[str, float]]()
    late, soon = Counting(1, 0, log, "late"), Counting(3, 0.05, log, "soon")
    start = time.monotonic()
    clock.add(late, start + 0.3)
    clock.add(soon, start + 0.1)
    assert late.done.wait(10) and soon.done.wait(10)
    assert [name for name, _ in log] == ["soon", "soon", "soon", "late"]
    assert all(at >= start + 0.1 for _, at in log[:3]) and log[3][1] >= start + 0.3
    assert log[1][1] - log[0][1] >= 0.05 and log[2][1] - log[1][1] >= 0.05
    assert len(clock) == 0  # both asked no more


def test_a_forgotten_watch_is_never_woken_and_its_entries_do_not_pile_up() -> None:
    clock, log = WatchClock(), list[tuple[str, float]]()
    soon = time.monotonic() + 0.5  # due before the kept one, forgotten long before that
    forgotten = [
        clock.add(Counting(1, 0, log, "closed"), soon + 600 * bool(n)) for n in range(1000)
    ]
    kept = Counting(1, 0, log, "kept")
    clock.add(kept, soon + 0.5)
    for entry in forgotten:
        clock.forget(entry)
    assert kept.done.wait(10)
    assert [name for name, _ in log] == ["kept"]
    assert len(clock) == 0
    assert len(clock._heap) < 100  # rebuilt, not 1,000 emptied entries kept for ten minutes


class Failing:
    def __init__(self) -> None:
        self.calls = 0

    def tick(self) -> float | None:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("a bug in a watch")
        return None


def test_a_watch_that_raises_is_woken_again_and_the_others_go_on() -> None:
    clock, log = WatchClock(), list[tuple[str, float]]()
    failing, other = Failing(), Counting(2, 0.05, log, "other")
    clock.add(failing, time.monotonic())
    clock.add(other, time.monotonic())
    assert other.done.wait(10)
    wait_until(lambda: failing.calls == 2, 10)
    assert len(clock) == 0
