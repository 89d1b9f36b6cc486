"""The process's memory of agent rows: row id by (type, name) and back, bounded.

Agent rows are never deleted, so a remembered pair never goes stale; what needs a bound is
the number of pairs. A worker or web process serving one agent per user or per conversation
sees millions of them over its life, and kept every pair it ever looked up (~300 bytes each).
Only the most recently used ``capacity`` pairs are kept now; a forgotten one costs one read of
its row when it is next needed.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

AgentKey = tuple[str, str]  # (agent_type, agent_name)

DEFAULT_CAPACITY = 65_536  # ~20 MB at most


class AgentRows:
    """Row ids and identities of the most recently used agents; safe across threads."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._ids: OrderedDict[AgentKey, int] = OrderedDict()
        self._keys: OrderedDict[int, AgentKey] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return max(len(self._ids), len(self._keys))

    def id_of(self, key: AgentKey) -> int | None:
        """The row id of ``key``, if remembered."""
        with self._lock:
            found = self._ids.get(key)
            if found is not None:
                self._ids.move_to_end(key)
            return found

    def key_of(self, agent_id: int) -> AgentKey | None:
        """The (type, name) of row ``agent_id``, if remembered."""
        with self._lock:
            found = self._keys.get(agent_id)
            if found is not None:
                self._keys.move_to_end(agent_id)
            return found

    def remember(self, agent_id: int, key: AgentKey) -> None:
        """Keep the pair both ways, forgetting the least recently used beyond ``capacity``."""
        with self._lock:
            self._ids[key] = agent_id
            self._ids.move_to_end(key)
            self._keys[agent_id] = key
            self._keys.move_to_end(agent_id)
            while len(self._ids) > self.capacity:
                self._ids.popitem(last=False)
            while len(self._keys) > self.capacity:
                self._keys.popitem(last=False)
