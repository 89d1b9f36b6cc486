"""Admin sessions that end on the server.

Flask's session is a signed cookie: on its own, logging out only asks the browser to forget
it, and a copy taken earlier keeps working. So each login gets a random session id, kept in
Redis under ``<prefix>:admin-session:<id>`` with the token's fingerprint and a TTL of
``admin_session_ttl_s`` (renewed by every request), and the cookie carries that id. Every
request checks it; logging out deletes it, so copies die with it; ``end_all`` logs everyone
out (the operator's "log out everywhere").

Redis restarts with nothing on disk here: every session id is gone and everyone is logged out,
the safe direction. Redis unreachable: session requests answer 503; bearer tokens still work.
"""

from __future__ import annotations

import secrets

from think_jobs import ThinkJobs

__all__ = ["end", "end_all", "live_fingerprint", "session_key", "start"]


def session_key(prefix: str, session_id: str) -> str:
    """STRING: the token fingerprint of a live admin session; TTL ``admin_session_ttl_s``."""
    return f"{prefix}:admin-session:{session_id}"


def start(jobs: ThinkJobs, fingerprint: str) -> str:
    """A new live session for the token with ``fingerprint``; returns its id."""
    session_id = secrets.token_urlsafe(32)
    key = session_key(jobs.keys.prefix, session_id)
    jobs.redis.set(key, fingerprint, ex=jobs.settings.admin_session_ttl_s)
    return session_id


def live_fingerprint(jobs: ThinkJobs, session_id: str) -> str | None:
    """The fingerprint of a live session (its lifetime renewed), or None once it ended."""
    key = session_key(jobs.keys.prefix, session_id)
    found = jobs.redis.getex(key, ex=jobs.settings.admin_session_ttl_s)
    return found.decode() if isinstance(found, bytes) else found


def end(jobs: ThinkJobs, session_id: str) -> None:
    """End one session (logout): every copy of its cookie stops working."""
    jobs.redis.delete(session_key(jobs.keys.prefix, session_id))


def end_all(jobs: ThinkJobs) -> int:
    """Log everyone out of the admin pages; returns how many sessions ended."""
    pattern = session_key(jobs.keys.prefix, "*")
    ended = 0
    for key in jobs.redis.scan_iter(match=pattern, count=500):
        ended += int(jobs.redis.delete(key))
    return ended
