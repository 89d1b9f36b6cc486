"""``celery -A think_jobs.celery_entry ...``: plain Celery commands against the ThinkJobs object
named by ``$THINK_JOBS_APP`` (e.g. ``celery -A think_jobs.celery_entry inspect ping``)."""

from __future__ import annotations

from think_jobs.app_loading import check_database_url, load_app_or_default

_jobs = load_app_or_default(None)
check_database_url(_jobs.settings.database_url)
app = _jobs.celery
