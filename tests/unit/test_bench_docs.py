"""``bench.run_all --write-docs`` rewrites what it measured and keeps the dated sections people
wrote by hand (before 2026-12-06 evening it rewrote the whole page, dropping them)."""

from __future__ import annotations

from bench.run_all import docs_page, hand_written

OLD = """# Benchmarks

Produced by ...

Measured 2026-11-30 02:23 UTC.

| Machine | |
|---|---|
| CPU | old |

## 2026-12-06 evening: a note

Figures of the evening.

### A part of it

More.

## Earlier measurements

Older notes.

## Targets

| old target table |

## All figures

| old figures |
"""

NEW = """Measured 2026-12-06 21:30 UTC.

| Machine | |
|---|---|
| CPU | new |

## Targets

| new target table |

## All figures

| new figures |"""


def test_the_page_gets_the_new_tables_and_keeps_every_dated_section() -> None:
    page = docs_page(NEW, hand_written(OLD))
    assert "Measured 2026-12-06 21:30 UTC." in page and "| CPU | new |" in page
    assert "| new target table |" in page and "| new figures |" in page
    assert "old" not in page  # no old date, machine or table is left
    kept = "## 2026-12-06 evening: a note\n\nFigures of the evening.\n\n### A part of it"
    assert kept in page and "## Earlier measurements\n\nOlder notes." in page
    assert page.index("| CPU | new |") < page.index(kept) < page.index("## Targets")
    assert page.count("## Targets") == 1 and page.startswith("# Benchmarks\n\n")


def test_a_page_without_dated_sections_is_the_summary_alone() -> None:
    page = docs_page(NEW, hand_written(""))
    assert page.endswith(
        "| CPU | new |\n\n## Targets\n\n| new target table |\n\n## All figures\n\n| new figures |\n"
    )
