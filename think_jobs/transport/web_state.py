"""What the web edge keeps in Redis, behind named operations: admin sessions that end on the
server, and the agent a webhook delivery id was first delivered to.

Sessions: each login gets a random id kept under ``Keys.admin_session`` with the token's
fingerprint and a TTL renewed by every request; logging out deletes it, so copies of the
cookie die with it; ``end_all_sessions`` logs everyone out. A Redis restarted empty logs
everyone out (the safe direction). Every operation raises ``BrokerUnavailableError`` when
Redis cannot answer.
"""

from __future__ import annotations

import secrets

import redis

from think_jobs.keys import Keys
from think_jobs.transport.clients import broker_errors


def start_session(client: redis.Redis, keys: Keys, fingerprint: str, *, ttl_s: int) -> str:
    """A new live session for the token with ``fingerprint``; returns its id."""
    session_id = secrets.token_urlsafe(32)
    with broker_errors("starting an admin session"):
        client.set(keys.admin_session(session_id), fingerprint, ex=ttl_s)
    return session_id


def session_fingerprint(
    client: redis.Redis, keys: Keys, session_id: str, *, ttl_s: int
) -> str | None:
    """The fingerprint of a live session (its lifetime renewed), or None once it ended."""
    with broker_errors("reading an admin session"):
        found = client.getex(keys.admin_session(session_id), ex=ttl_s)
    return found.decode() if isinstance(found, bytes) else found


def end_session(client: redis.Redis, keys: Keys, session_id: str) -> None:
    with broker_errors("ending an admin session"):
        client.delete(keys.admin_session(session_id))


def end_all_sessions(client: redis.Redis, keys: Keys) -> int:
    """End every admin session; returns how many ended."""
    ended = 0
    with broker_errors("ending every admin session"):
        for key in client.scan_iter(match=keys.admin_session("*"), count=500):
            ended += int(client.delete(key))
    return ended


def claim_delivery(
    client: redis.Redis, keys: Keys, delivery_id: str, agent: str, *, ttl_s: int
) -> str | None:
    """Bind a delivery id to the first agent it reaches; the other agent's address when it
    was already delivered elsewhere, else None."""
    key = keys.webhook_delivery(delivery_id)
    with broker_errors("recording a webhook delivery"):
        if client.set(key, agent, nx=True, ex=ttl_s):
            return None
        owner = client.get(key)
    text = owner.decode() if isinstance(owner, bytes) else owner
    return text if text is not None and text != agent else None
