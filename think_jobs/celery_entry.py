"""``celery -A think_jobs.celery_entry ...``: plain Celery commands against the ThinkJobs object
named by ``$THINK_JOBS_APP`` (e.g. ``celery -A think_jobs.celery_entry inspect ping``)."""

from __future__ import annotations

from think_jobs.cli.main import load_app

app = load_app(None).celery
