"""Finding a ``ThinkJobs`` object from ``module:attribute`` (``--app`` and ``$THINK_JOBS_APP``)."""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

from think_jobs.errors import ConfigurationError

if TYPE_CHECKING:
    from think_jobs.runtime import ThinkJobs

APP_VARIABLE = "THINK_JOBS_APP"


def app_spec_of(spec: str | None) -> str | None:
    """``--app`` or, without it, ``$THINK_JOBS_APP`` (None when neither is set)."""
    return spec or os.environ.get(APP_VARIABLE) or None


def load_app_or_default(spec: str | None) -> ThinkJobs:
    """The object ``spec`` (or ``$THINK_JOBS_APP``) names; a default ``ThinkJobs()`` without
    either. Raises ``ConfigurationError``."""
    from think_jobs.runtime import ThinkJobs

    found = app_spec_of(spec)
    return load_jobs(found) if found else ThinkJobs()


def load_jobs(spec: str) -> ThinkJobs:
    """Import ``module:attribute`` (attribute defaults to ``jobs``) and return that object.

    The working directory is importable, as with ``celery -A`` and ``flask --app``.
    """
    from think_jobs.runtime import ThinkJobs

    module_name, _, attribute = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigurationError(f"cannot import {module_name!r} ({spec!r}): {error}") from error
    found: Any = getattr(module, attribute or "jobs", None)
    if not isinstance(found, ThinkJobs):
        raise ConfigurationError(f"{spec!r} does not name a ThinkJobs object")
    return found


def check_database_url(url: str) -> None:
    """Refuse, in one line, a database URL that cannot work: unparsable, an unknown dialect,
    or a driver that is not installed (what SQLAlchemy would report as a long traceback)."""
    from think_jobs.db.engine import check_url

    check_url(url)
