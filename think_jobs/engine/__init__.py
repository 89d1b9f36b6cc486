"""The engine: admission, claims, attempts, the watch, blocking calls, drains, schedules and
workflows — the ordering and durability rules at work.

It takes narrow ports (``engine.ports``: the ``Services`` it uses and the ``AgentHooks`` an
agent offers) and never imports ``Think``, ``ThinkJobs``, Celery, the CLI or the web.
"""
