"""Before and after: one benchmark run on a base revision and on this checkout, alternately.

On a 2-core VM whose speed drifts during a sitting, one run of each side says little: this
runs ``pairs`` pairs, alternating which side goes first, each side from its own tree (the base
revision exported with ``git archive`` into a temporary directory that shares this checkout's
virtualenv), and prints each figure's values on both sides, their medians and the ratio of the
medians (this checkout ÷ base). The benchmark is any of ``bench``'s scripts that take
``--json``; its arguments follow ``--``.

    .venv/bin/python -m bench.compare --base fe1716d [--pairs 3] -- \\
        bench.fifo_throughput --plain --rounds 1
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.report import Figure, load

ROOT = Path(__file__).resolve().parents[1]
Key = tuple[str, str, str]  # bench, case, metric


def export(revision: str, into: Path) -> str:
    """The tree of ``revision`` in ``into`` (with this checkout's virtualenv); its short sha."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short", revision], cwd=ROOT, check=True, capture_output=True,
        text=True,
    ).stdout.strip()  # fmt: skip
    archive = subprocess.run(
        ["git", "archive", sha], cwd=ROOT, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    (into / ".venv").symlink_to(ROOT / ".venv")
    return sha


def run_once(tree: Path, command: Sequence[str], out: Path) -> list[Figure]:
    """``python -m <command> --json out`` in ``tree``; its figures."""
    argv = [str(ROOT / ".venv/bin/python"), "-m", *command, "--json", str(out)]
    finished = subprocess.run(argv, cwd=tree, capture_output=True, text=True)
    if finished.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed in {tree}:\n{finished.stderr[-3000:]}")
    return load(out)


def _median_ratio(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f}x" if ratios else ""


def table(base: str, series: dict[str, dict[Key, list[Figure]]]) -> str:
    """Per figure: each side's values, their medians, this ÷ base, and each side's median
    ratio to the reference its own runs measured (robust to the machine's drift)."""
    lines = [
        f"| Benchmark | Case | Metric | base {base} | this checkout | median base | median this "
        "| this ÷ base | base ÷ its reference | this ÷ its reference |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for key, before in series["base"].items():
        after = series["this"].get(key, [])
        if not after:
            continue
        sides = [[f.value for f in figures] for figures in (before, after)]
        old, new = (statistics.median(values) for values in sides)
        ratio = f"{new / old:.2f}x" if old else ""
        shown = [", ".join(f"{v:.3g}" for v in values) for values in sides]
        to_reference = [
            _median_ratio([f.ratio for f in figures if f.ratio is not None])
            for figures in (before, after)
        ]
        lines.append(
            f"| {' | '.join(key)} | {shown[0]} | {shown[1]} | {old:.3g} | {new:.3g} | {ratio} "
            f"| {to_reference[0]} | {to_reference[1]} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    split = args.index("--") if "--" in args else len(args)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the git revision to compare with")
    parser.add_argument("--pairs", type=int, default=3)
    options = parser.parse_args(args[:split])
    command = args[split + 1 :]
    if not command:
        parser.error("give the benchmark after --, e.g. -- bench.fifo_throughput --plain")
    series: dict[str, dict[Key, list[Figure]]] = {"base": {}, "this": {}}
    with tempfile.TemporaryDirectory(prefix="tj-compare-") as scratch:
        trees = {"base": Path(scratch) / "base", "this": ROOT}
        trees["base"].mkdir()
        sha = export(options.base, trees["base"])
        for pair in range(options.pairs):
            order = ("base", "this") if pair % 2 == 0 else ("this", "base")
            for side in order:
                out = Path(scratch) / f"{side}-{pair}.json"
                for figure in run_once(trees[side], command, out):
                    key = (figure.bench, figure.case, figure.metric)
                    series[side].setdefault(key, []).append(figure)
                print(f"[compare] pair {pair + 1}/{options.pairs}: {side} done", file=sys.stderr)
    print(table(sha, series))


if __name__ == "__main__":
    main()
