"""The domain: what a turn is and the rules that decide what happens to it — no I/O.

``status`` holds every status and stop vocabulary; ``records`` the records the layers above
pass around (a turn as stored, a turn to store, a claim, an admission); ``policy`` the pure
decisions (what to do with an orphaned turn, who must be nudged after a release, which
existing submission two ids name). Nothing here imports SQLAlchemy, Redis, Celery or Flask.
"""
