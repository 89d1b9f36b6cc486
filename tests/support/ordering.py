"""Checks of the ordering guarantee over RecordingModel events."""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Any


def turns_by_agent(events: list[dict[str, Any]]) -> dict[str, list[tuple[int, int, str]]]:
    """Per agent: (start tick, end tick, label) of each model call, in start order."""
    starts: dict[tuple[str, str], int] = {}
    runs: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for event in sorted(events, key=lambda e: e["tick"]):
        key = (event["agent"], event["label"])
        if event["what"] == "start":
            starts[key] = event["tick"]
        elif event["what"] == "end":
            runs[event["agent"]].append((starts.pop(key), event["tick"], event["label"]))
    for agent_runs in runs.values():
        agent_runs.sort()
    return dict(runs)


def overlaps_within_agents(runs: dict[str, list[tuple[int, int, str]]]) -> list[str]:
    problems = []
    for agent, agent_runs in runs.items():
        for before, after in itertools.pairwise(agent_runs):
            if after[0] < before[1]:
                problems.append(f"{agent}: {after[2]} started before {before[2]} ended")
    return problems


def order_violations(
    runs: dict[str, list[tuple[int, int, str]]], admitted: dict[str, list[str]]
) -> list[str]:
    problems = []
    for agent, labels in admitted.items():
        started = [label for _, _, label in runs.get(agent, [])]
        if started != labels:
            problems.append(f"{agent}: started {started}, admitted {labels}")
    return problems


def agents_ran_in_parallel(runs: dict[str, list[tuple[int, int, str]]]) -> bool:
    """True if some call of one agent overlapped a call of another agent."""
    spans = sorted((start, end, agent) for agent, rs in runs.items() for start, end, _ in rs)
    return any(
        later[0] < earlier[1] and later[2] != earlier[2]
        for i, earlier in enumerate(spans)
        for later in spans[i + 1 : i + 8]
    )
