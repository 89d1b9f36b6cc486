"""The admin dashboard page: queue depth and turn latency over the last hour (server-rendered
SVG), the oldest pending submission per agent type (and, when no live worker serves its type,
why it waits), running turns that look stuck, and the live workers.

Everything comes from one read transaction on the database (``ThinkJobs.dashboard()``); the
page holds no state and needs no JavaScript. Configuration (Flask config):
``THINK_JOBS_DASHBOARD_STUCK_FACTOR`` (5) and ``THINK_JOBS_DASHBOARD_STUCK_MIN_S`` (60).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from flask import current_app, render_template
from markupsafe import Markup

from think_jobs import reports as queries
from think_jobs.errors import BrokerUnavailableError
from think_jobs.results import WorkerRecord
from web.charts import Axis, Chart, Frame, Series, bar_chart, line_chart, number
from web.current import current_extension

WIDE = Frame(width=960, height=240)  # the depth chart spans the page
HALF = Frame(width=470, height=240)  # latency and throughput side by side
MAX_LINES = 5  # agent types drawn one by one on the depth chart (the busiest), besides "all"


@dataclass(frozen=True)
class Charts:
    depth: Markup
    latency: Markup
    throughput: Markup


def render() -> str:
    jobs = current_extension().jobs
    data = jobs.dashboard(rule=stuck_rule())
    workers = live_workers()
    return render_template(
        "think_jobs/dashboard.html",
        data=data,
        charts=charts(data),
        oldest=oldest_by_type(data.oldest, jobs.agent_types),
        registered=set(jobs.agent_types),
        workers=workers,
        waiting=waiting_reasons(data.oldest, workers),
        running=describe_running,
        age=age,
    )


def describe_running(worker: WorkerRecord) -> list[str]:
    """``drain Lead:weekly (3 s)`` for each task the worker runs (``running_described``)."""
    return worker.running_described()


def live_workers() -> list[WorkerRecord] | None:
    """The live workers and beats, or None when Redis cannot tell."""
    try:
        return current_extension().jobs.live_workers()
    except BrokerUnavailableError:
        return None


def waiting_reasons(
    found: Sequence[queries.OldestPending], workers: list[WorkerRecord] | None
) -> dict[str, str]:
    """Why the pending turns of a type wait, for the types that no live worker serves."""
    if workers is None:
        return {row.agent_type: "cannot tell which workers are live (Redis)" for row in found}
    jobs = current_extension().jobs
    reasons = {
        row.agent_type: jobs.waiting_reason(row.agent_type, workers=workers) for row in found
    }
    return {agent_type: reason for agent_type, reason in reasons.items() if reason}


def oldest_by_type(
    found: Sequence[queries.OldestPending], agent_types: Sequence[str]
) -> dict[str, queries.OldestPending | None]:
    """Every registered agent type (None: nothing pending), plus any other type found."""
    rows: dict[str, queries.OldestPending | None] = dict.fromkeys(agent_types)
    rows.update((row.agent_type, row) for row in found)
    return rows


def stuck_rule() -> queries.StuckRule:
    config = current_app.config
    return queries.StuckRule(
        factor=float(config["THINK_JOBS_DASHBOARD_STUCK_FACTOR"]),
        min_s=float(config["THINK_JOBS_DASHBOARD_STUCK_MIN_S"]),
    )


def charts(data: queries.DashboardData) -> Charts:
    buckets = clock_axis([bucket.end for bucket in data.latency], every=2)  # 10 minutes
    return Charts(
        depth=depth_chart(data.depth),
        latency=latency_chart(data.latency, buckets),
        throughput=throughput_chart(data.latency, buckets),
    )


def depth_chart(depth: queries.DepthSeries) -> Markup:
    total = depth.total
    peak = max(range(len(total)), key=lambda i: (total[i], i))
    chart = Chart(
        "tj-chart-depth",
        "Queue depth, last hour",
        f"Pending turns each minute: {total[-1]} now, peak {total[peak]} at "
        f"{clock(depth.instants[peak])} UTC.",
        integer=True,
        frame=WIDE,
    )
    busiest = sorted(depth.by_type, key=lambda kind: -max(depth.by_type[kind]))[:MAX_LINES]
    lines = [Series(kind, depth.by_type[kind]) for kind in sorted(busiest)]
    if len(depth.by_type) != 1:
        lines.insert(0, Series("all", total))
    return line_chart(chart, clock_axis(depth.instants, every=10), lines)  # 10 minutes


def latency_chart(buckets: Sequence[queries.LatencyBucket], axis: Axis) -> Markup:
    latest = next((b for b in reversed(buckets) if b.p95_s is not None), None)
    summary = "no turn finished in the last hour."
    if latest is not None and latest.p50_s is not None and latest.p95_s is not None:
        summary = (
            f"latest (to {clock(latest.end)} UTC): p50 {number(latest.p50_s)} s, "
            f"p95 {number(latest.p95_s)} s."
        )
    chart = Chart(
        "tj-chart-latency",
        "Turn run time, last hour",
        f"p50 and p95 per 5 minutes; {summary}",
        unit="s",
        frame=HALF,
    )
    lines = [
        Series("p50", [b.p50_s for b in buckets]),
        Series("p95", [b.p95_s for b in buckets]),
    ]
    return line_chart(chart, axis, lines, markers=True)


def throughput_chart(buckets: Sequence[queries.LatencyBucket], axis: Axis) -> Markup:
    total = sum(b.count for b in buckets)
    chart = Chart(
        "tj-chart-throughput",
        "Turns finished, last hour",
        f"Turns that reached a final status per 5 minutes: {total} in the last hour.",
        integer=True,
        frame=HALF,
    )
    return bar_chart(chart, axis, [float(b.count) for b in buckets])


def clock_axis(moments: Sequence[datetime], *, every: int) -> Axis:
    """HH:MM labels (UTC); every n-th printed, counting back from the last one."""
    ticks = list(range(len(moments) - 1, -1, -every))[::-1]
    return Axis([clock(moment) for moment in moments], ticks)


def clock(moment: datetime) -> str:
    return moment.strftime("%H:%M")


def age(seconds: float) -> str:
    """A waiting or running time for people: 1.5 s, 45 s, 12 min, 3.5 h, 2.0 d."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.1f} d"
