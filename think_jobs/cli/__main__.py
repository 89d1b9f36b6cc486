"""``python -m think_jobs.cli``."""

from think_jobs.cli.main import main

main()
