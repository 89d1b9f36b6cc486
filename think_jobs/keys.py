"""Every Redis key and channel think-jobs uses, in one place.

An agent is addressed as ``<agent_type>:<agent_name>``; request ids are unique per agent, so
they always come after the agent part. Keys that hold data carry a TTL (see Settings).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    prefix: str

    def stream_buffer(self, agent: str, turn_id: int) -> str:
        """LIST of a turn's stream events (JSON), index == seq; TTL ``stream_ttl_s``. Keyed
        by the turn's row id: a request id reused after a delete starts a fresh stream."""
        return f"{self.prefix}:stream:{agent}:{turn_id}"

    def stream_state(self, agent: str, turn_id: int) -> str:
        """HASH beside a turn's buffer: the owner ``epoch`` (attempt) and ``sealed``."""
        return f"{self.prefix}:stream-state:{agent}:{turn_id}"

    def chunk_channel(self, agent: str) -> str:
        """Pub/sub channel carrying every stream event of every request of one agent."""
        return f"{self.prefix}:chunks:{agent}"

    def all_chunks_pattern(self) -> str:
        """Pattern matching every agent's chunk channel (dashboards)."""
        return f"{self.prefix}:chunks:*"

    def revoked(self, agent: str, turn_id: int) -> str:
        """STRING holding the cancel reason of a turn; TTL ``revocation_ttl_s``."""
        return f"{self.prefix}:revoked:{agent}:{turn_id}"

    def turn_released(self, agent: str) -> str:
        """Pub/sub channel: an agent's lease was released (wakes callers waiting their turn)."""
        return f"{self.prefix}:released:{agent}"

    def presence_index(self) -> str:
        """SET of the ids of the presence records of live workers and beats."""
        return f"{self.prefix}:presence"

    def presence_record(self, record_id: str) -> str:
        """STRING: one worker's (or beat's) presence record, JSON; TTL a few heartbeats."""
        return f"{self.prefix}:presence:{record_id}"

    def admin_session(self, session_id: str) -> str:
        """STRING: a live admin session (the token's fingerprint); TTL ``admin_session_ttl_s``."""
        return f"{self.prefix}:admin-session:{session_id}"

    def webhook_delivery(self, delivery_id: str) -> str:
        """STRING: the agent that claimed a webhook delivery id (replays are refused)."""
        return f"{self.prefix}:webhook-delivery:{delivery_id}"

    def swept(self, agent_id: int) -> str:
        """STRING set while a sweeper-sent drain for the agent is queued (dedupes sweeps)."""
        return f"{self.prefix}:swept:{agent_id}"


def agent_address(agent_type: str, agent_name: str) -> str:
    return f"{agent_type}:{agent_name}"
