"""Figures, targets, the markdown table every script prints, and the machine they ran on."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Literal


@dataclass(frozen=True)
class Target:
    """``ratio op limit``: e.g. ``>= 0.6`` (throughput) or ``<= 3`` (latency); with
    ``absolute`` the value itself is compared (e.g. order violations ``<= 0``)."""

    op: Literal[">=", "<="]
    limit: float
    absolute: bool = False

    def __str__(self) -> str:
        symbol = "≥" if self.op == ">=" else "≤"
        return f"{symbol} {self.limit:g}" + ("" if self.absolute else "x")

    def met(self, number: float) -> bool:
        return number >= self.limit if self.op == ">=" else number <= self.limit


@dataclass(frozen=True)
class Figure:
    """One measured value, and the reference it is compared with (measured in the same run)."""

    bench: str
    case: str
    metric: str
    value: float
    reference: float | None = None
    reference_name: str = ""
    target: Target | None = None
    spread: tuple[float, float] | None = None  # lowest and highest ratio over repeated runs

    @property
    def ratio(self) -> float | None:
        if self.reference is None or self.reference == 0:
            return None
        return self.value / self.reference

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        number = self.value if self.target.absolute else self.ratio
        return None if number is None else self.target.met(number)


def _number(value: float | None) -> str:
    if value is None:
        return ""
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _verdict(figure: Figure) -> str:
    if figure.met is None:
        return ""
    return "yes" if figure.met else "**no**"


HEADER = ("Benchmark", "Case", "Metric", "think-jobs", "Reference", "Ratio", "Target", "Met")


def table(figures: Iterable[Figure]) -> str:
    """The figures as a markdown table."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for f in figures:
        reference = _number(f.reference)
        if f.reference_name:
            reference = f"{reference} ({f.reference_name})"
        ratio = "" if f.ratio is None else f"{f.ratio:.2f}x"
        if f.spread is not None:
            ratio += f" ({f.spread[0]:.2f}-{f.spread[1]:.2f})"
        target = "" if f.target is None else str(f.target)
        cells = (f.bench, f.case, f.metric, _number(f.value), reference, ratio, target)
        lines.append("| " + " | ".join((*cells, _verdict(f))) + " |")
    return "\n".join(lines)


def save(figures: Sequence[Figure], path: Path) -> None:
    path.write_text(json.dumps([asdict(f) for f in figures], indent=1))


def load(path: Path) -> list[Figure]:
    figures = []
    for item in json.loads(path.read_text()):
        target, spread = item.pop("target"), item.pop("spread")
        figures.append(
            Figure(
                **item,
                target=None if target is None else Target(**target),
                spread=None if spread is None else (spread[0], spread[1]),
            )
        )
    return figures


def combine(runs: Sequence[Sequence[Figure]]) -> list[Figure]:
    """One figure per (bench, case, metric) over repeated runs: the run with the median ratio
    (or value), so a value and its reference always come from the same run; ``spread`` keeps
    the lowest and highest ratio seen."""
    grouped: dict[tuple[str, str, str], list[Figure]] = {}
    for figures in runs:
        for figure in figures:
            grouped.setdefault((figure.bench, figure.case, figure.metric), []).append(figure)
    combined = []
    for same in grouped.values():
        ordered = sorted(same, key=lambda f: f.value if f.ratio is None else f.ratio)
        chosen = ordered[(len(ordered) - 1) // 2]
        ratios = [f.ratio for f in same if f.ratio is not None]
        spread = (min(ratios), max(ratios)) if len(ratios) > 1 else None
        combined.append(replace(chosen, spread=spread))
    return combined


def publish(figures: Sequence[Figure], args: argparse.Namespace) -> None:
    """Print the table (and write JSON when ``--json`` was given)."""
    print(table(figures), flush=True)
    if args.json is not None:
        save(figures, args.json)


def run_backends(
    args: argparse.Namespace, run_backend: Callable[[str, argparse.Namespace], list[Figure]]
) -> list[Figure]:
    """Run ``run_backend`` on every chosen backend, print (and save) the figures together."""
    figures = [f for backend in backends_of(args) for f in run_backend(backend, args)]
    publish(figures, args)
    return figures


def parser(
    description: str, *, backends: str | None = "postgres,sqlite"
) -> argparse.ArgumentParser:
    """The options every script shares (and SIGTERM made to clean up like Ctrl-C)."""
    from bench.services import exit_cleanly_on_sigterm

    exit_cleanly_on_sigterm()
    found = argparse.ArgumentParser(description=description)
    found.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    found.add_argument("--json", type=Path, default=None, help="also write the figures here")
    if backends is not None:
        found.add_argument(
            "--backends",
            default=backends,
            help=f"comma-separated: postgres, sqlite (default: {backends})",
        )
    return found


def backends_of(args: argparse.Namespace) -> list[str]:
    chosen = [b.strip() for b in str(args.backends).split(",") if b.strip()]
    unknown = set(chosen) - {"postgres", "sqlite"}
    if unknown:
        raise SystemExit(f"unknown backend(s): {', '.join(sorted(unknown))}")
    return chosen


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> str:
    try:
        first = Path("/proc/meminfo").read_text().splitlines()[0]
        return f"{int(first.split()[1]) / 1024 / 1024:.1f} GiB"
    except (OSError, IndexError, ValueError):
        return "unknown"


def _server_version(command: list[str]) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else "unknown"


def machine() -> list[tuple[str, str]]:
    """What the figures were measured on."""
    packages = ("celery", "kombu", "redis", "sqlalchemy", "psycopg")
    versions = ", ".join(f"{name} {metadata.version(name)}" for name in packages)
    return [
        ("CPU", f"{_cpu_model()} x {os.cpu_count()}"),
        ("Memory", _memory_gib()),
        ("OS", f"{platform.system()} {platform.release()}"),
        ("Python", platform.python_version()),
        ("PostgreSQL", _server_version(["psql", "--version"])),
        ("Redis", _server_version(["redis-server", "--version"])),
        ("Packages", versions),
    ]


def machine_table() -> str:
    rows = ["| Machine | |", "|---|---|"]
    rows += [f"| {key} | {value} |" for key, value in machine()]
    return "\n".join(rows)
