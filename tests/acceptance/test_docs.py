"""The documentation as a user meets it (issues 16 and 17): every Python block of README.md and
docs/ runs as written against the real services, the site builds with ``mkdocs build --strict``
(a broken link or anchor fails), and the configuration table is the one ``Settings`` makes.

How a page runs, top to bottom, in a fresh directory with this test's database and Redis:

* a ```` ```python ```` block whose first line is a comment naming a ``.py`` file
  (``# mypkg/agents.py``) is written to that file;
* every other Python block is run as a script (``python block.py``) and must exit 0;
* ``<!-- doc-test: worker APP -->`` starts ``think-jobs worker --app APP`` until the page ends;
* ``<!-- doc-test: run COMMAND -->`` runs a shell command there, which must exit 0.

Where a block names ``OpenAIChatModel``, ``ScriptedModel`` answers (tests/support/doc_models).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.processes import ROOT, WorkerProcess

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_TOKEN = re.compile(
    r"^(?P<indent> *)```(?P<lang>[\w-]*)\n(?P<body>.*?)^(?P=indent)```\s*$"
    r"|<!-- doc-test: (?P<verb>\w+) (?P<arg>.*?) -->",
    re.M | re.S,
)
_FILE = re.compile(r"#\s*(?P<path>[\w./-]+\.py)\b")
STANDINS = ROOT / "tests" / "support" / "doc_standins"


@dataclass(frozen=True)
class Step:
    kind: str  # "file", "script", "worker", "run"
    text: str
    line: int
    path: str = ""


def steps_of(page: Path) -> list[Step]:
    """The page's Python blocks and directives, in order."""
    source = page.read_text()
    found = []
    for match in _TOKEN.finditer(source):
        line = source.count("\n", 0, match.start()) + 1
        if match["verb"]:
            found.append(Step(match["verb"], match["arg"].strip(), line))
        elif match["lang"] == "python":
            found.append(_block(textwrap.dedent(match["body"]), line))
    return found


def _block(body: str, line: int) -> Step:
    first = body.splitlines()[0] if body.strip() else ""
    named = _FILE.fullmatch(first.split("(")[0].strip())
    if named:
        return Step("file", body, line, named["path"])
    return Step("script", body, line)


def _environment(settings_env: dict[str, str], project: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("THINK_JOBS_")}
    path = os.pathsep.join([str(project), str(STANDINS), str(ROOT), clean.get("PYTHONPATH", "")])
    bin_path = os.pathsep.join([str(Path(sys.executable).parent), clean.get("PATH", "")])
    return {
        **clean,
        **settings_env,
        "PATH": bin_path,  # as in an activated virtualenv: python, think-jobs, pytest
        "PYTHONPATH": path,
        "THINK_JOBS_LOG_LEVEL": "WARNING",
    }


def _run(command: list[str] | str, project: Path, env: dict[str, str], where: str) -> None:
    result = subprocess.run(
        command, cwd=project, env=env, capture_output=True, text=True, timeout=240,
        shell=isinstance(command, str),
    )  # fmt: skip
    assert result.returncode == 0, f"{where} failed:\n{result.stdout}\n{result.stderr}"


def run_page(page: Path, project: Path, env: dict[str, str]) -> Iterator[str]:
    """Run every step of ``page``; yields what ran (for the test's count). A ``worker``
    directive replaces the worker an earlier one started (the page moved to another app)."""
    with ExitStack() as running:
        for number, step in enumerate(steps_of(page)):
            where = f"{page.name}:{step.line}"
            if step.kind == "file":
                _write(project / step.path, step.text, env, where)
            elif step.kind == "script":
                script = project / f"_block_{number}.py"
                script.write_text(step.text)
                _run([sys.executable, script.name], project, env, where)
            elif step.kind == "worker":
                running.close()
                process = WorkerProcess(env, app=step.text, concurrency=2, pool="threads")
                running.callback(process.stop)
                process.wait_ready(60)
            elif step.kind == "run":
                _run(step.text, project, env, where)
            else:
                raise AssertionError(f"{where}: unknown doc-test directive {step.kind!r}")
            yield f"{step.kind} {where}"


def _write(target: Path, text: str, env: dict[str, str], where: str) -> None:
    """A file block: written where its first line says, and it must at least compile."""
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    _run([sys.executable, "-m", "py_compile", str(target)], target.parent, env, where)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_python_block_runs_as_written(
    page: Path, settings_env: dict[str, str], tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    ran = list(run_page(page, project, _environment(settings_env, project)))
    blocks = page.read_text().count("```python")
    assert sum(1 for r in ran if r.startswith(("file", "script"))) == blocks, ran


def test_readme_has_runnable_blocks() -> None:
    kinds = [step.kind for step in steps_of(ROOT / "README.md")]
    assert kinds.count("script") >= 2 and "worker" in kinds


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).with_name("mkdocs")
    result = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "configuration" / "index.html").exists()


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [the guide](missing.md#nowhere).\n")
    (tmp_path / "mkdocs.yml").write_text((ROOT / "mkdocs.yml").read_text().split("nav:")[0])
    mkdocs = Path(sys.executable).with_name("mkdocs")
    result = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0 and "missing.md" in result.stdout + result.stderr


def test_the_configuration_page_has_the_table_the_code_makes() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/settings_table.py", "--check"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_every_setting_is_read_by_the_code() -> None:
    from think_jobs.settings import Settings

    code = _code_outside_settings()
    unread = {name for name in Settings.model_fields if not re.search(rf"\.{name}\b", code)}
    unread -= _read_through_properties(unread, code)
    assert unread == set(), unread


def _code_outside_settings() -> str:
    files = [*(ROOT / "think_jobs").rglob("*.py"), *(ROOT / "web").rglob("*.py")]
    return "\n".join(p.read_text() for p in files if p.name != "settings.py")


def _read_through_properties(names: set[str], code: str) -> set[str]:
    """Fields a ``Settings`` property reads, when the code reads that property."""
    import ast

    tree = ast.parse((ROOT / "think_jobs" / "settings.py").read_text())
    settings = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Settings")
    found = set()
    for node in settings.body:
        if isinstance(node, ast.FunctionDef) and re.search(rf"\.{node.name}\b", code):
            found |= {a.attr for a in ast.walk(node) if isinstance(a, ast.Attribute)}
    return names & found
