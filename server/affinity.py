"""Prefix affinity: which engine replica holds a conversation's KV prefix.

A conversation is named by a hash of its messages through the first user turn: every later
turn of the same conversation starts with those messages, so every turn hashes to the same
key (the same key picks its KV slot inside a replica, :func:`conversation_slot`). The table
remembers the replica that last served each key, so the next turn can be sent where the
engine can reuse the prefix instead of prefilling the whole history again. It is bounded: the
least recently used conversations are forgotten first, and a forgotten one is simply routed
as a new one.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: Conversations remembered at once; one entry is a 40-character key and an int.
DEFAULT_CONVERSATIONS = 65536


def conversation_key(messages: Sequence[Any]) -> str:
    """The hex SHA-1 of the messages through the first user turn (all of them if none is)."""
    prefix = []
    for message in messages:
        prefix.append(message)
        if isinstance(message, dict) and message.get("role") == "user":
            break
    return hashlib.sha1(json.dumps(prefix, sort_keys=True, default=str).encode()).hexdigest()


def conversation_slot(messages: Sequence[Any], kv_slots: int) -> int:
    """A stable KV slot per conversation inside one engine: its key modulo ``kv_slots``."""
    if kv_slots <= 1:
        return 0
    return int(conversation_key(messages)[:16], 16) % kv_slots


@dataclass
class AffinityCounts:
    """Follow-up turns sent to the replica holding their prefix (``hits``) or elsewhere
    because it was not ready (``misses``), and first turns (``new``)."""

    hits: int = 0
    misses: int = 0
    new: int = 0

    def as_json(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "new": self.new}


class AffinityTable:
    def __init__(self, capacity: int = DEFAULT_CONVERSATIONS) -> None:
        if capacity < 1:
            raise ValueError(f"the affinity table needs room for one conversation, "
                             f"got {capacity}")
        self.capacity = capacity
        self._replicas: OrderedDict[str, int] = OrderedDict()
        self.counts = AffinityCounts()

    def __len__(self) -> int:
        return len(self._replicas)

    def replica_for(self, key: str) -> int | None:
        """The replica that last served ``key``, or None for a conversation not seen (or
        forgotten)."""
        return self._replicas.get(key)

    def served(self, key: str, wanted: int | None, replica: int) -> None:
        """Record that ``replica`` took a turn of ``key`` whose prefix was on ``wanted``."""
        if wanted is None:
            self.counts.new += 1
        elif wanted == replica:
            self.counts.hits += 1
        else:
            self.counts.misses += 1
        self._replicas[key] = replica
        self._replicas.move_to_end(key)
        while len(self._replicas) > self.capacity:
            self._replicas.popitem(last=False)
