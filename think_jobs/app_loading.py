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
    from sqlalchemy import exc
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except exc.ArgumentError as error:
        raise ConfigurationError(
            "the database URL (THINK_JOBS_DATABASE_URL) is not a URL; expected e.g. "
            "sqlite:///think_jobs.db or postgresql+psycopg://user:password@host/db"
        ) from error
    shown = parsed.render_as_string(hide_password=True)
    try:
        parsed.get_dialect().import_dbapi()
    except exc.NoSuchModuleError as error:
        raise ConfigurationError(
            f"database URL {shown}: SQLAlchemy knows no database {parsed.drivername!r}"
        ) from error
    except ImportError as error:
        raise ConfigurationError(
            f"database URL {shown}: its driver is not installed ({error}); install it, or use "
            "postgresql+psycopg:// with think-jobs[postgres]"
        ) from error
