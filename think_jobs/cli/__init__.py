"""The ``think-jobs`` command line (``think_jobs.cli.main``) and the demo it runs."""
