"""Timing: latency samples in two regimes (back to back, and after an idle gap), percentiles.

On a small VM an idle CPU drops into a deep sleep state, so the first round trip after a pause
costs several times one made back to back (see PITFALLS.md): every latency here is measured in
both regimes.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

IDLE_GAP_S = 0.05


@dataclass(frozen=True)
class Latency:
    """Latency samples of one operation, and the CPU time this thread spent in each call
    (less sensitive than wall time to other load on the machine), in milliseconds."""

    samples_ms: tuple[float, ...]
    cpu_ms: tuple[float, ...] = ()

    @property
    def p50(self) -> float:
        return percentile(self.samples_ms, 50)

    @property
    def p99(self) -> float:
        return percentile(self.samples_ms, 99)

    @property
    def cpu_p50(self) -> float:
        return percentile(self.cpu_ms, 50)

    @property
    def total_s(self) -> float:
        return sum(self.samples_ms) / 1000

    @property
    def rate_per_s(self) -> float:
        """Sequential throughput: calls per second of busy time."""
        return len(self.samples_ms) / self.total_s

    def __add__(self, other: Latency) -> Latency:
        return Latency(self.samples_ms + other.samples_ms, self.cpu_ms + other.cpu_ms)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile with linear interpolation between closest ranks."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def sample(call: Callable[[int], object], *, count: int, gap_s: float = 0.0) -> Latency:
    """Time ``call(i)`` for i in range(count), sleeping ``gap_s`` before each call."""
    samples: list[float] = []
    cpu: list[float] = []
    for index in range(count):
        if gap_s:
            time.sleep(gap_s)
        start, start_cpu = time.perf_counter(), time.thread_time()
        call(index)
        samples.append((time.perf_counter() - start) * 1000)
        cpu.append((time.thread_time() - start_cpu) * 1000)
    return Latency(tuple(samples), tuple(cpu))


def regimes(*, gapped: bool = True) -> list[tuple[str, float]]:
    """The (name, gap) pairs latencies are measured in."""
    found = [("back to back", 0.0)]
    if gapped:
        found.append((f"{IDLE_GAP_S * 1000:.0f} ms idle gaps", IDLE_GAP_S))
    return found
