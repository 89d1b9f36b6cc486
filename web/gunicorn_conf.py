"""gunicorn settings for the web app (``gunicorn -c python:web.gunicorn_conf 'web:create_app()'``).

With several gunicorn workers each process counts its own Prometheus metrics; when
``PROMETHEUS_MULTIPROC_DIR`` is set they write their samples there and a scrape adds them up.
The directory must start empty (``on_starting`` wipes it) and a dead worker's live samples
must be forgotten (``child_exit``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

MULTIPROC_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"


def on_starting(server: Any) -> None:
    """Before the first worker forks: an empty metrics directory."""
    directory = os.environ.get(MULTIPROC_VARIABLE)
    if directory:
        shutil.rmtree(directory, ignore_errors=True)
        Path(directory).mkdir(parents=True)


def child_exit(server: Any, worker: Any) -> None:
    """A worker exited: drop its gauges' live samples (counters stay counted)."""
    if os.environ.get(MULTIPROC_VARIABLE):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]
