"""Benchmarks of think-jobs against the bare ingredients it is built from.

Every script prints its figures next to the same operation done with the bare ingredient
(an INSERT+COMMIT, a Celery ``apply_async``, a Redis PUBLISH, ...) measured in the same run,
and the ratio between them. See ``bench/README.md``.
"""
