"""Run every benchmark (each in its own process) and print one summary table.

    .venv/bin/python -m bench.run_all [--quick] [--only accept,stream] [--repeat 3] [--write-docs]

With ``--repeat N`` every benchmark runs N times (in rotation, so slow drift in the machine's
load is spread over all of them) and each figure is the run with the median ratio, with the
range of ratios next to it. ``--write-docs`` also writes the table and the machine description
to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bench import report
from bench.report import Figure
from bench.services import ROOT, exit_cleanly_on_sigterm

BENCHMARKS = ("accept", "turn_overhead", "fifo_throughput", "stream", "scale", "capacity")
DOCS = ROOT / "docs" / "benchmarks.md"


def run_one(name: str, *, quick: bool, directory: Path, attempt: int) -> list[Figure]:
    """Run one benchmark in its own process; [] (reported) if it failed."""
    output = directory / f"{name}-{attempt}.json"
    command = [sys.executable, "-m", f"bench.{name}", "--json", str(output)]
    if quick:
        command.append("--quick")
    print(f"\n## {name} (run {attempt + 1})\n", flush=True)
    started = time.perf_counter()
    child = subprocess.Popen(command, cwd=ROOT)
    try:
        code = child.wait()
    finally:
        if child.poll() is None:  # interrupted: let the child remove what it created
            child.terminate()
            child.wait(120)
    print(f"\n({name} took {time.perf_counter() - started:.0f} s)", flush=True)
    if code != 0:
        print(f"**{name} failed (exit status {code}); its figures are left out**", flush=True)
        return []
    return report.load(output)


def headline(figures: list[Figure]) -> list[Figure]:
    """The figures with a target, and the CPU-per-unit figures that explain them."""
    return [f for f in figures if f.target is not None or "CPU" in f.metric]


def summary(figures: list[Figure], *, quick: bool, repeat: int) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    mode = " (--quick smoke run: not representative)" if quick else ""
    if repeat > 1:
        mode += (
            f"; each benchmark ran {repeat} times: the run with the median ratio is shown, "
            "with the lowest-highest ratio in brackets"
        )
    return "\n\n".join(
        [
            f"Measured {when}{mode}.",
            report.machine_table(),
            "## Targets\n\n" + report.table(headline(figures)),
            "## All figures\n\n" + report.table(figures),
        ]
    )


_INTRO = (
    "# Benchmarks\n\n"
    "Produced by `.venv/bin/python -m bench.run_all --write-docs` (see `bench/README.md` "
    "for what each benchmark does). Every figure is compared with the bare ingredient "
    "measured in the same run; ratios are think-jobs / reference.\n\n"
)
_GENERATED = "\n## Targets\n"  # where the generated tables begin, after the dated sections


def write_docs(text: str) -> None:
    """Rewrite the generated parts of the page (when, the machine, the tables) and keep the
    dated sections written by hand between the machine table and ``## Targets``."""
    DOCS.parent.mkdir(exist_ok=True)
    kept = hand_written(DOCS.read_text()) if DOCS.exists() else ""
    DOCS.write_text(docs_page(text, kept))


def docs_page(text: str, kept: str) -> str:
    """The page: the intro, ``summary``'s text with ``kept`` before its ``## Targets``."""
    measured, tables = text.split(_GENERATED.lstrip("\n"), 1)
    return f"{_INTRO}{measured}{kept}{_GENERATED.lstrip()}{tables}\n"


def hand_written(page: str) -> str:
    """The sections of ``page`` after its machine table and before ``## Targets`` (the
    dated notes people add by hand), each heading included; empty when there are none."""
    start, end = page.find("\n## "), page.find(_GENERATED)
    if start == -1 or end == -1 or start >= end:
        return ""
    return page[start + 1 : end + 1] + "\n"


def main(argv: list[str] | None = None) -> None:
    exit_cleanly_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke-run every benchmark")
    parser.add_argument("--only", default=",".join(BENCHMARKS), help="comma-separated names")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each benchmark")
    parser.add_argument("--write-docs", action="store_true", help=f"write {DOCS.name}")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = set(names) - set(BENCHMARKS)
    if unknown:
        raise SystemExit(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    runs: list[list[Figure]] = []
    with tempfile.TemporaryDirectory(prefix="tj-bench-") as directory:
        for attempt in range(args.repeat):
            runs += [
                run_one(name, quick=args.quick, directory=Path(directory), attempt=attempt)
                for name in names
            ]
    text = summary(report.combine(runs), quick=args.quick, repeat=args.repeat)
    print("\n# Summary\n\n" + text, flush=True)
    if args.write_docs:
        write_docs(text)


if __name__ == "__main__":
    main()
