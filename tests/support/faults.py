"""Fault scenarios shared by the reliability tests and ``bench/reliability.py``: run real
worker processes, inject faults, then check that nothing accepted was lost, duplicated or run
out of order."""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from tests.apps.agents import Journal, Recorder, read_events
from tests.support.builders import directive
from tests.support.processes import WorkerProcess
from think_jobs import ThinkJobs
from think_jobs.domain.policy import INTERRUPTED_AFTER_APPLIED, INTERRUPTED_PARTIALLY_APPLIED
from think_jobs.messages import message_text
from think_jobs.replay import assemble
from think_jobs.testing import wait_until

# How long a cancelled turn's partial may take to be stored after its attempt died: its lease
# lapses (a few seconds in the fault tests and the bench), then a sweep sends the drain that
# stores it. Waited only while a cancelled turn's stored reply does not rebuild its stream.
_SETTLE_S = 30.0

SECTION_9_ERRORS = {INTERRUPTED_AFTER_APPLIED, INTERRUPTED_PARTIALLY_APPLIED}


@dataclass
class Report:
    scenario: str
    faults: int = 0
    submissions: int = 0
    completed: int = 0
    section_9_errors: int = 0
    lost: int = 0
    duplicated: int = 0
    order_violations: int = 0
    overlaps: int = 0
    stale_writes: int = 0
    stream_mismatches: int = 0
    recovered: int = 0  # submissions that needed more than one attempt (the fault hit them)
    aborted: int = 0  # cancelled by a client (``check``'s ``cancelled``) and ended aborted
    problems: list[str] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)  # those submissions, with their timelines

    def row(self) -> str:
        return (
            f"| {self.scenario} | {self.faults} | {self.submissions} | {self.completed} | "
            f"{self.section_9_errors} | {self.lost} | {self.duplicated} | "
            f"{self.order_violations} | {self.overlaps} | {self.stale_writes} | "
            f"{self.stream_mismatches} |"
        )

    @property
    def anomalies(self) -> tuple[int, ...]:
        return (
            self.lost,
            self.duplicated,
            self.order_violations,
            self.overlaps,
            self.stale_writes,
            self.stream_mismatches,
        )


HEADER = (
    "| scenario | faults injected | submissions | completed | §9 errors | lost | duplicated "
    "| order violations | overlaps | stale writes | stream ≠ reply |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


def submit_load(
    jobs: ThinkJobs, *, agents: int, per_agent: int, words: int, delay_s: float, **spec: Any
) -> dict[str, list[tuple[str, str]]]:
    """Interleaved submissions; returns per agent the admitted (label, submission id).
    ``spec`` goes into every directive (``hold_s``...)."""
    text = " ".join(f"w{i}" for i in range(words))
    admitted: dict[str, list[tuple[str, str]]] = {f"agent-{a}": [] for a in range(agents)}
    for n, a in itertools.product(range(per_agent), range(agents)):
        name, label = f"agent-{a}", f"agent-{a}#{n}"
        result = jobs.get_agent(Recorder, name).submit_messages(
            [directive(f"m-{label}", label=label, text=text, delay_s=delay_s, **spec)]
        )
        admitted[name].append((label, result.submission_id))
    return admitted


def unfinished(jobs: ThinkJobs, admitted: dict[str, list[tuple[str, str]]]) -> int:
    return sum(
        len(jobs.get_agent(Recorder, name).list_submissions(status=["pending", "running"]))
        for name in admitted
    )


def record_kill(jobs: ThinkJobs, pid: int) -> None:
    """Put the kill in the journal, so a started-but-never-ended call ends there."""
    Journal(jobs).write({"what": "killed", "pid": pid})


def kill_workers_while_running(
    jobs: ThinkJobs,
    env: dict[str, str],
    admitted: dict[str, list[tuple[str, str]]],
    *,
    kills: int,
    spawn: Callable[[], WorkerProcess],
    workers: list[WorkerProcess],
) -> int:
    """SIGKILL a worker (alternating) each time another share of the load finished."""
    total = sum(len(v) for v in admitted.values())
    done = 0
    for k in range(kills):
        threshold = (k + 1) * total // (kills + 2)

        def finished_enough(t: int = threshold) -> bool:
            return total - unfinished(jobs, admitted) >= t

        wait_until(finished_enough, 120)
        victim = workers.pop(k % len(workers))
        record_kill(jobs, victim.process.pid)
        victim.kill()
        replacement = spawn()
        replacement.wait_ready()
        workers.insert(k % (len(workers) + 1), replacement)
        done += 1
    return done


def check(
    jobs: ThinkJobs,
    admitted: dict[str, list[tuple[str, str]]],
    report: Report,
    cancelled: Collection[str] = (),
) -> Report:
    """Judge from outside: the journal, the public API and the streams a client reads. The
    ``cancelled`` labels (a client cancelled them while they ran) may end ``aborted``."""
    events = read_events(jobs)
    runs = _runs(events)
    for name, entries in admitted.items():
        agent = jobs.get_agent(Recorder, name)
        recovered = report.recovered
        _check_statuses(agent, entries, report, cancelled)
        if report.recovered > recovered:
            report.retried.append(timeline(events, name))
        _check_messages(agent, entries, report)
        overlaps = report.overlaps
        _check_order(name, runs.get(name, []), [label for label, _ in entries], report)
        if report.overlaps > overlaps:
            report.problems.append(timeline(events, name))
        streams = report.stream_mismatches + report.stale_writes
        _check_streams(agent, entries, report, cancelled)
        if report.stream_mismatches + report.stale_writes > streams:
            report.problems.append(timeline(events, name))
    return report


def timeline(events: list[dict[str, Any]], agent: str) -> str:
    """The agent's model calls and every process event, one compact line each (what a failed
    overlap check shows, so that CI's log alone tells what happened)."""
    lines = []
    for event in sorted(events, key=lambda e: e["tick"]):
        mine = event.get("agent") == agent and event["what"] in ("start", "holding", "end")
        if mine or event["what"] in _PROCESS_EVENTS:
            where = f"pid={event['pid']} t={event.get('t')}"
            what = event.get("label", event.get("kind", ""))
            lines.append(f"{event['tick']} {event['what']} {what} {where}")
    return f"{agent} timeline: " + "; ".join(lines)


def _check_streams(
    agent: Any, entries: list[tuple[str, str]], report: Report, cancelled: Collection[str]
) -> None:
    """Every completed turn's stream, as a client reads it: contiguous seqs, one ``done`` at
    the end, events of no attempt after a newer attempt's, and the stored reply rebuilt; the
    same for a cancelled turn that ended ``aborted``, unless its stream showed nothing (SPEC
    §5: a cancelled running turn keeps its partial reply)."""
    replies = {m.id: m for m in agent.get_messages() if m.role == "assistant"}
    for label, submission_id in entries:
        found = agent.inspect_submission(submission_id)
        ended = ("completed", "aborted") if label in cancelled else ("completed",)
        if found is None or found.status not in ended:
            continue
        events = list(agent.stream(submission_id, timeout_s=30))
        attempts = [e.attempt or 0 for e in events]
        if attempts != sorted(attempts):
            report.stale_writes += 1
            report.problems.append(f"{label}: stream attempts out of order {attempts}")
        if [e.seq for e in events] != list(range(len(events))) or [e.done for e in events] != [
            False
        ] * (len(events) - 1) + [True]:
            report.stream_mismatches += 1
            report.problems.append(f"{label}: stream seqs/done broken")
            continue
        reply = replies.get(_assistant_message_id(agent.jobs, agent, submission_id) or "")
        chunks = [e.chunk for e in events if e.chunk is not None]
        if found.status == "aborted" and not _rebuilds(chunks, reply):
            reply = _settled(agent, submission_id, chunks)
            if reply is None and not assemble(chunks, "").parts:
                continue  # cancelled before its stream showed anything
        if reply is None or assemble(chunks, reply.id).parts != reply.parts:
            report.stream_mismatches += 1
            streamed = message_text(assemble(chunks, reply.id if reply else "")) if chunks else ""
            stored = message_text(reply) if reply is not None else None
            report.problems.append(
                f"{label}: the stream does not rebuild the stored reply (attempts "
                f"{sorted(set(attempts))}; streamed {streamed!r}; stored {stored!r}; "
                f"by attempt: {_by_attempt(events)}; the submission: attempt {found.attempt}, "
                f"status {found.status}, error {found.error!r})"
            )


def _rebuilds(chunks: list[dict[str, Any]], reply: Any) -> bool:
    return reply is not None and assemble(chunks, reply.id).parts == reply.parts


def _settled(agent: Any, submission_id: str, chunks: list[dict[str, Any]]) -> Any:
    """The stored reply of a cancelled turn, once it rebuilds what its stream showed or
    ``_SETTLE_S`` has passed: a turn cancelled while its attempt was dead has its streamed
    partial stored only once the attempt's lease lapsed and someone took it over (a sweep's
    drain at the latest)."""
    deadline = time.monotonic() + _SETTLE_S
    while True:
        message_id = _assistant_message_id(agent.jobs, agent, submission_id) or ""
        reply = next((m for m in agent.get_messages() if m.id == message_id), None)
        if _rebuilds(chunks, reply) or time.monotonic() >= deadline:
            return reply
        time.sleep(0.1)


def _by_attempt(events: list[Any]) -> str:
    """What each attempt put in a stream, as text deltas and chunk types (a post-mortem)."""
    shown: list[str] = []
    for attempt, group in itertools.groupby(events, key=lambda e: e.attempt or 0):
        chunks = [e.chunk for e in group if e.chunk is not None]
        text = "".join(c.get("delta", "") for c in chunks if c.get("type") == "text-delta")
        kinds = Counter(str(c.get("type")) for c in chunks if c.get("type") != "text-delta")
        shown.append(f"{attempt}: {text!r} + {dict(kinds)}")
    return "; ".join(shown)


def _check_statuses(
    agent: Any, entries: list[tuple[str, str]], report: Report, cancelled: Collection[str]
) -> None:
    for label, submission_id in entries:
        report.submissions += 1
        found = agent.inspect_submission(submission_id)
        if found is None or found.status in ("pending", "running"):
            report.lost += 1
            report.problems.append(f"{label}: {found.status if found else 'missing'}")
        elif found.status == "aborted" and label in cancelled:
            report.aborted += 1
        elif found.status == "completed":
            report.completed += 1
            report.recovered += found.attempt > 1
        elif found.status == "error" and found.error in SECTION_9_ERRORS:
            report.section_9_errors += 1
        else:
            report.lost += 1
            report.problems.append(f"{label}: {found.status} {found.error}")


def _check_messages(agent: Any, entries: list[tuple[str, str]], report: Report) -> None:
    counts = Counter(m.id for m in agent.get_messages() if m.role == "user")
    for label, _ in entries:
        seen = counts.get(f"m-{label}", 0)
        if seen > 1:
            report.duplicated += 1
            report.problems.append(f"{label}: user message stored {seen} times")


_PROCESS_EVENTS = frozenset({"killed", "stopping", "stopped", "resumed", "injected"})


def _runs(events: list[dict[str, Any]]) -> dict[str, list[tuple[int, int, str]]]:
    """Per agent: (start, end, label) of each model call. A killed call ends at its kill; a
    call whose process was stopped (SIGSTOP) for longer than the lease ends at the stop when
    another call of the agent started after the stop, before it ended: its lease lapsed while
    it was frozen, so it had lost the turn (whether the takeover came during the stop or, its
    slots busy, after the resume), and what it did after resuming is judged by the stream and
    the database, which must show none of it, and by ``zombie_tails``."""
    ordered = sorted(events, key=lambda e: e["tick"])
    kills = {e["pid"]: e["tick"] for e in ordered if e["what"] == "killed"}
    stops = _long_stops(ordered)
    open_calls: dict[tuple[str, str, int], int] = {}
    runs: dict[str, list[tuple[int, int, str]]] = {}
    for event in ordered:
        if event["what"] in _PROCESS_EVENTS or event["what"] not in ("start", "end"):
            continue
        key = (event["agent"], event["label"], event["pid"])
        if event["what"] == "start":
            open_calls[key] = event["tick"]
        else:
            start = open_calls.pop(key)
            end = _effective_end(ordered, stops, event, start)
            runs.setdefault(event["agent"], []).append((start, end, event["label"]))
    for (agent, label, pid), start in open_calls.items():
        runs.setdefault(agent, []).append((start, kills.get(pid, 10**12), label))
    for agent_runs in runs.values():
        agent_runs.sort()
    return runs


def _effective_end(
    ordered: list[dict[str, Any]], stops: list[dict[str, Any]], ending: dict[str, Any], start: int
) -> int:
    """Where the call that began at ``start`` and ends with the event ``ending`` ended for the
    judge: at one of the ``stops`` of its process (each longer than the lease) inside the call,
    if another call of its agent started after that stop and before ``ending``; else there."""
    agent, pid, end = ending["agent"], ending["pid"], int(ending["tick"])
    for stop in stops:
        froze = int(stop["from_tick"])  # the freeze began after this event, before the stop
        if stop["pid"] != pid or not (start < stop["tick"] and froze < end):
            continue
        if any(
            e["what"] == "start" and e.get("agent") == agent and froze < e["tick"] < end
            for e in ordered
        ):
            return max(start, froze)
    return end


def _long_stops(ordered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stops that lasted longer than the lease TTL they name, each with ``from_tick``: the
    ``stopping`` event written just before the signal (the freeze began after it and before
    the ``stopped`` event; the stop's own tick when there is none)."""
    found = []
    for stop in (e for e in ordered if e["what"] == "stopped"):
        resumed = _resume_of(ordered, stop)
        lasted = (resumed["t"] if resumed is not None else float("inf")) - stop["t"]
        if lasted > stop["lease_ttl_s"]:
            found.append({**stop, "from_tick": _stopping_of(ordered, stop)})
    return found


def _stopping_of(ordered: list[dict[str, Any]], stop: dict[str, Any]) -> int:
    before = [
        e["tick"]
        for e in ordered
        if e["what"] == "stopping" and e["pid"] == stop["pid"] and e["tick"] < stop["tick"]
    ]
    return max(before, default=int(stop["tick"]))


def _resume_of(ordered: list[dict[str, Any]], stop: dict[str, Any]) -> dict[str, Any] | None:
    return next(
        (
            e
            for e in ordered
            if e["tick"] > stop["tick"] and e["what"] == "resumed" and e["pid"] == stop["pid"]
        ),
        None,
    )


def zombie_tails(events: list[dict[str, Any]]) -> list[int]:
    """For each model call a stop froze for longer than the lease and another call of its agent
    superseded (started after the stop, before it ended): how many chunks it yielded after its
    process resumed. Its lease lapsed while it was frozen and was taken, so it must stop within
    one chunk of the resume (a call whose lease nobody took renews it and may go on)."""
    ordered = sorted(events, key=lambda e: e["tick"])
    stops = _long_stops(ordered)
    tails: list[int] = []
    for stop in stops:
        resumed = _resume_of(ordered, stop)
        after = 10**12 if resumed is None else resumed["tick"]
        for call in _open_at(ordered, stop):
            ending = _ending_of(ordered, call)
            if _effective_end(ordered, stops, ending, call["tick"]) != ending["tick"]:
                tails.append(_chunks_after(ordered, call, after))
    return tails


def _ending_of(ordered: list[dict[str, Any]], call: dict[str, Any]) -> dict[str, Any]:
    """The call's ``end`` event (a stand-in past every tick when it never ended)."""
    same = ("pid", "label", "agent")
    return next(
        (
            e
            for e in ordered
            if e["tick"] > call["tick"]
            and e["what"] == "end"
            and all(e.get(key) == call[key] for key in same)
        ),
        {**call, "what": "end", "tick": 10**12},
    )


def _open_at(ordered: list[dict[str, Any]], stop: dict[str, Any]) -> list[dict[str, Any]]:
    calls: dict[tuple[str, str], dict[str, Any]] = {}
    for event in ordered:
        if event["tick"] > stop["tick"]:
            break
        if event.get("pid") != stop["pid"] or event["what"] not in ("start", "end"):
            continue
        key = (event["agent"], event["label"])
        if event["what"] == "start":
            calls[key] = event
        else:
            calls.pop(key, None)
    return list(calls.values())


def _chunks_after(ordered: list[dict[str, Any]], call: dict[str, Any], resumed: int) -> int:
    chunks = 0
    for event in ordered:
        same = event.get("pid") == call["pid"] and event.get("agent") == call["agent"]
        if event["tick"] <= resumed or not same or event.get("label") != call["label"]:
            continue
        if event["what"] == "end":
            break
        chunks += event["what"] == "chunk"
    return chunks


def _check_order(
    name: str, runs: list[tuple[int, int, str]], labels: list[str], report: Report
) -> None:
    for before, after in itertools.pairwise(runs):
        if after[0] < before[1]:
            report.overlaps += 1
            report.problems.append(f"{name}: {after[2]} started before {before[2]} ended")
    first_starts = list(dict.fromkeys(label for _, _, label in runs))
    expected = [label for label in labels if label in set(first_starts)]
    if first_starts != expected:
        report.order_violations += 1
        report.problems.append(f"{name}: started {first_starts}, admitted {expected}")


def recovered_replies(
    jobs: ThinkJobs, admitted: dict[str, list[tuple[str, str]]]
) -> list[tuple[str, int, str]]:
    """(label, attempts, reply text) of every submission that needed more than one attempt."""
    found = []
    for name, entries in admitted.items():
        agent = jobs.get_agent(Recorder, name)
        replies = {m.id: message_text(m) for m in agent.get_messages() if m.role == "assistant"}
        for label, submission_id in entries:
            inspection = agent.inspect_submission(submission_id)
            if inspection is None or inspection.attempt < 2:
                continue
            reply_id = _assistant_message_id(jobs, agent, submission_id)
            found.append((label, inspection.attempt, replies.get(reply_id or "", "")))
    return found


def _assistant_message_id(jobs: ThinkJobs, agent: Any, submission_id: str) -> str | None:
    from think_jobs.db import turns as turn_ops

    agent_id = jobs.agent_id_of(agent, create=False)
    assert agent_id is not None
    with jobs.db.read() as conn:
        turn = turn_ops.get_turn(conn, agent_id, submission_id)
    return turn.assistant_message_id if turn else None
