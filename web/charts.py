"""Small server-side SVG charts for the admin dashboard: lines and bars, axes, a legend.

Pure functions from numbers to markup: no JavaScript, no inline ``style`` (the admin's CSP
allows only its own stylesheet; colours come from ``tj-series-N`` classes in ``style.css``).
Each chart is an ``<svg role="img">`` named by its ``<title>`` and ``<desc>``; every point and
bar carries its own ``<title>``, which browsers show on hover and screen readers can reach.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

SERIES_CLASSES = 6  # tj-series-0 .. tj-series-5, then the colours repeat


@dataclass(frozen=True)
class Series:
    """One line: a value per point (``None`` leaves a gap)."""

    name: str
    values: Sequence[float | None]


@dataclass(frozen=True)
class Axis:
    """The x axis: a label per point or bar (for titles) and which of them to print."""

    labels: Sequence[str]
    ticks: Sequence[int]


@dataclass(frozen=True)
class Frame:
    """Geometry in SVG user units; the chart scales to its container, text with it (pick a
    width close to the width shown so the labels keep their size)."""

    width: float = 720
    height: float = 220
    left: float = 52
    right: float = 20
    top: float = 28
    bottom: float = 28

    @property
    def plot_width(self) -> float:
        return self.width - self.left - self.right

    @property
    def baseline(self) -> float:
        return self.height - self.bottom


@dataclass(frozen=True)
class Chart:
    """What every chart needs: an id unique on the page, a title and a one-line summary."""

    chart_id: str
    title: str
    description: str
    unit: str = ""
    integer: bool = False  # counts: whole-number ticks
    frame: Frame = Frame()


@dataclass(frozen=True)
class _Plot:
    """Where values land: the frame, the value at the top of the y axis, and x per index."""

    frame: Frame
    top: float
    x: Callable[[int], float]

    def y(self, value: float) -> float:
        return self.frame.baseline - (self.frame.baseline - self.frame.top) * value / self.top


def line_chart(
    chart: Chart, axis: Axis, series: Sequence[Series], *, markers: bool = False
) -> Markup:
    """Lines over evenly spaced points; ``markers`` adds a dot (with a title) per value."""
    frame, last = chart.frame, max(len(axis.labels) - 1, 1)
    largest = max((v for s in series for v in s.values if v is not None), default=0)
    top, ticks = scale(largest, integer=chart.integer)
    plot = _Plot(frame, top, lambda i: frame.left + frame.plot_width * i / last)
    body = [*_y_axis(plot, ticks, chart.unit), *_x_axis(plot, axis)]
    for index, line in enumerate(series):
        css = f"tj-series-{index % SERIES_CLASSES}"
        for segment in _segments(line.values):
            coordinates = " ".join(f"{plot.x(i):.1f},{plot.y(v):.1f}" for i, v in segment)
            body.append(f'<polyline class="tj-line {css}" points="{coordinates}"/>')
        if markers:
            body.extend(_markers(plot, line, css, axis, chart.unit))
    body.extend(_legend(frame, [s.name for s in series]))
    return _svg(chart, body)


def bar_chart(chart: Chart, axis: Axis, values: Sequence[float]) -> Markup:
    """One bar per value, each as wide as its slot minus a gap."""
    frame = chart.frame
    top, ticks = scale(max(values, default=0), integer=chart.integer)
    slot = frame.plot_width / max(len(values), 1)
    plot = _Plot(frame, top, lambda i: frame.left + slot * (i + 0.5))
    body = [*_y_axis(plot, ticks, chart.unit), *_x_axis(plot, axis)]
    for index, value in enumerate(values):
        y = plot.y(value)
        label = escape(f"{axis.labels[index]}: {number(value)} {chart.unit}".strip())
        body.append(
            f'<rect class="tj-bar" x="{plot.x(index) - slot * 0.4:.1f}" y="{y:.1f}" '
            f'width="{slot * 0.8:.1f}" height="{frame.baseline - y:.1f}">'
            f"<title>{label}</title></rect>"
        )
    return _svg(chart, body)


def scale(largest: float, *, integer: bool = False) -> tuple[float, list[float]]:
    """A round top for the y axis and its five evenly spaced ticks from 0 (top 1 if empty)."""
    step = nice((largest if largest > 0 else 1.0) / 4, integer=integer)
    return step * 4, [step * i for i in range(5)]


def nice(value: float, *, integer: bool = False) -> float:
    """The smallest round step not below ``value``: 1, 2, 2.5 or 5 times a power of ten
    (whole numbers only, and no 2.5, when ``integer``)."""
    if integer and value <= 1:
        return 1.0
    power = math.pow(10, math.floor(math.log10(value)))
    multiples = (1, 2, 5, 10) if integer else (1, 2, 2.5, 5, 10)
    return next(power * m for m in multiples if power * m >= value)


def number(value: float) -> str:
    """Short and readable: 1234, 12.3, 1.23, 0.123."""
    if value >= 100 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.3g}"


def _svg(chart: Chart, body: list[str]) -> Markup:
    ident = escape(chart.chart_id)
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="tj-chart" role="img" '
        f'viewBox="0 0 {chart.frame.width:g} {chart.frame.height:g}" '
        f'aria-labelledby="{ident}-title {ident}-desc" id="{ident}">'
        f'<title id="{ident}-title">{escape(chart.title)}</title>'
        f'<desc id="{ident}-desc">{escape(chart.description)}</desc>'
    )
    return Markup(head + "".join(body) + "</svg>")


def _y_axis(plot: _Plot, ticks: list[float], unit: str) -> Iterator[str]:
    left, right = plot.frame.left, plot.frame.left + plot.frame.plot_width
    for tick in ticks:
        y = plot.y(tick)
        yield f'<line class="tj-grid" x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}"/>'
        label = escape(f"{number(tick)} {unit}".strip())
        yield (
            f'<text class="tj-tick" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>'
        )


def _x_axis(plot: _Plot, axis: Axis) -> Iterator[str]:
    frame = plot.frame
    yield (
        f'<line class="tj-axis" x1="{frame.left}" y1="{frame.baseline}" '
        f'x2="{frame.left + frame.plot_width}" y2="{frame.baseline}"/>'
    )
    for index in axis.ticks:
        anchor = "end" if index == len(axis.labels) - 1 else "middle"  # stay inside the frame
        yield (
            f'<text class="tj-tick" x="{plot.x(index):.1f}" y="{frame.baseline + 18}" '
            f'text-anchor="{anchor}">{escape(axis.labels[index])}</text>'
        )


def _segments(values: Sequence[float | None]) -> Iterator[list[tuple[int, float]]]:
    """Runs of consecutive values with at least two points (a lone value is a marker only)."""
    run: list[tuple[int, float]] = []
    for index, value in enumerate([*values, None]):
        if value is not None:
            run.append((index, value))
            continue
        if len(run) > 1:
            yield run
        run = []


def _markers(plot: _Plot, line: Series, css: str, axis: Axis, unit: str) -> Iterator[str]:
    for index, value in enumerate(line.values):
        if value is None:
            continue
        label = escape(f"{axis.labels[index]} {line.name}: {number(value)} {unit}".strip())
        yield (
            f'<circle class="tj-dot {css}" cx="{plot.x(index):.1f}" cy="{plot.y(value):.1f}" '
            f'r="3.5"><title>{label}</title></circle>'
        )


def _legend(frame: Frame, names: Sequence[str]) -> Iterator[str]:
    """Swatches along the top (text width estimated: SVG cannot measure without a script)."""
    if len(names) < 2:
        return
    x = frame.left
    for index, name in enumerate(names):
        css = f"tj-series-{index % SERIES_CLASSES}"
        yield f'<rect class="tj-swatch {css}" x="{x:.1f}" y="8" width="12" height="12"/>'
        yield f'<text class="tj-legend" x="{x + 16:.1f}" y="18">{escape(name)}</text>'
        x += 32 + 7 * len(name)
