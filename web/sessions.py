"""Admin sessions that end on the server.

Flask's session is a signed cookie: on its own, logging out only asks the browser to forget
it, and a copy taken earlier keeps working. So each login gets a random session id, kept in
Redis (``ThinkJobs.start_admin_session``: ``<prefix>:admin-session:<id>``) with the token's
fingerprint and a TTL of ``admin_session_ttl_s`` (renewed by every request), and the cookie
carries that id. Every
request checks it; logging out deletes it, so copies die with it; ``end_all`` logs everyone
out (the operator's "log out everywhere").

Redis restarts with nothing on disk here: every session id is gone and everyone is logged out,
the safe direction. Redis unreachable: session requests answer 503; bearer tokens still work.
"""

from __future__ import annotations

from think_jobs import ThinkJobs

__all__ = ["end", "end_all", "live_fingerprint", "start"]


def start(jobs: ThinkJobs, fingerprint: str) -> str:
    """A new live session for the token with ``fingerprint``; returns its id."""
    return jobs.start_admin_session(fingerprint)


def live_fingerprint(jobs: ThinkJobs, session_id: str) -> str | None:
    """The fingerprint of a live session (its lifetime renewed), or None once it ended."""
    return jobs.admin_session_fingerprint(session_id)


def end(jobs: ThinkJobs, session_id: str) -> None:
    """End one session (logout): every copy of its cookie stops working."""
    jobs.end_admin_session(session_id)


def end_all(jobs: ThinkJobs) -> int:
    """Log everyone out of the admin pages; returns how many sessions ended."""
    return jobs.end_all_admin_sessions()
