"""Finding the ``ThinkJobs`` object a standalone web process serves: ``$THINK_JOBS_APP``."""

from __future__ import annotations

import importlib
import os
import sys

from think_jobs import ThinkJobs
from think_jobs.errors import ConfigurationError

APP_VARIABLE = "THINK_JOBS_APP"


def load_jobs(spec: str) -> ThinkJobs:
    """Import ``module:attribute`` (attribute defaults to ``jobs``) and return that object."""
    module_name, _, attribute = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigurationError(f"cannot import {module_name!r} ({spec!r}): {error}") from error
    found = getattr(module, attribute or "jobs", None)
    if not isinstance(found, ThinkJobs):
        raise ConfigurationError(f"{spec!r} does not name a ThinkJobs object")
    return found


def jobs_from_environment() -> ThinkJobs:
    spec = os.environ.get(APP_VARIABLE)
    if not spec:
        raise ConfigurationError(
            f"no ThinkJobs object: pass jobs= or set {APP_VARIABLE}=module:attribute "
            "(e.g. mypkg.agents:jobs)"
        )
    return load_jobs(spec)
