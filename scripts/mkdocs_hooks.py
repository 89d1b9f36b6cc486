"""MkDocs hooks (``mkdocs.yml``): the site is the README plus the guides in docs/.

* the README becomes the site's home page (``index.md``), so there is one text, not two;
* links written for GitHub are rewritten for the site: ``docs/x.md`` in the README becomes
  ``x.md``, and ``../README.md`` in a guide becomes ``index.md`` (anchors kept), before MkDocs
  validates them (``--strict`` fails on a broken one);
* docs/configuration.md gets the settings table generated from the code.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

sys.path.insert(0, str(Path(__file__).resolve().parent))
from settings_table import PAGE, with_table

README = Path(__file__).resolve().parents[1] / "README.md"


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, "index.md", content=README.read_text()))
    return files


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    path = page.file.src_path
    if path == "index.md":
        return markdown.replace("](docs/", "](")
    if path == PAGE.name:
        markdown = with_table(markdown)
    return markdown.replace("](../README.md", "](index.md")
