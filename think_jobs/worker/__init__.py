"""The Celery edge: the app and its configuration (``app``), every task (``tasks``), beat's
scheduler (``beat``), the consumer (``consumer``) and the worker's presence heartbeat.
Tasks are thin: they carry ids and call into the engine.
"""
