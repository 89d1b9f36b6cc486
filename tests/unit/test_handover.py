"""``RunningTurns``: what a stopping worker hands over (``think_jobs.engine.handover``)."""

from __future__ import annotations

from think_jobs.engine.handover import RunningTurns


class Attempt:
    def __init__(self) -> None:
        self.told: list[str] = []

    def hand_over(self, text: str) -> None:
        self.told.append(text)


def test_running_attempts_are_handed_over_and_later_ones_as_they_start() -> None:
    running = RunningTurns()
    first, ended, late = Attempt(), Attempt(), Attempt()
    running.add(first)
    running.add(ended)
    running.discard(ended)
    assert not running.handing_over
    assert running.hand_over("its worker is stopping") == 1
    assert running.handing_over
    running.add(late)  # claimed on its way while the worker stops
    assert (first.told, ended.told, late.told) == (
        ["its worker is stopping"],
        [],
        ["its worker is stopping"],
    )
    running.resume()  # a worker of this process started again
    again = Attempt()
    running.add(again)
    assert not running.handing_over and again.told == []
