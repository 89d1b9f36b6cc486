"""Finding the ``ThinkJobs`` object a standalone web process serves: ``$THINK_JOBS_APP``."""

from __future__ import annotations

import os

from think_jobs import ThinkJobs
from think_jobs.app_loading import APP_VARIABLE, load_jobs
from think_jobs.errors import ConfigurationError


def jobs_from_environment() -> ThinkJobs:
    spec = os.environ.get(APP_VARIABLE)
    if not spec:
        raise ConfigurationError(
            f"no ThinkJobs object: pass jobs= or set {APP_VARIABLE}=module:attribute "
            "(e.g. mypkg.agents:jobs)"
        )
    return load_jobs(spec)
