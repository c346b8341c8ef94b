"""Stored responses for previous_response_id and GET / DELETE /v1/responses/{id}.

In memory and bounded: at most `max_entries` responses (1000 by default; the least recently used
goes first) and each for `ttl_s` seconds (30 minutes) after it was last used. A stored response
keeps the whole conversation that led to it (chat messages, instructions excluded, as OpenAI
carries them over), so a continuation costs no lookups down a chain. Entries belong to the tenant
(API key) that made them: another tenant's id reads as unknown.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lantern.server.protocol import ChatMessage


@dataclass
class StoredResponse:
    tenant: str
    response: dict[str, Any]  # the response object as returned
    conversation: list[ChatMessage]  # input (with history) + output, as chat messages
    used: float


class ResponseStore:
    def __init__(
        self, max_entries: int = 1000, ttl_s: float = 1800.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_entries, self.ttl_s, self.clock = max_entries, ttl_s, clock
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()  # routes run on one loop, but tests and tools may not

    def put(self, response_id: str, tenant: str, response: dict[str, Any], conversation: list[ChatMessage]) -> None:
        with self._lock:
            now = self.clock()
            self._expire(now)
            self._entries[response_id] = StoredResponse(tenant, response, conversation, now)
            self._entries.move_to_end(response_id)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def get(self, response_id: str, tenant: str) -> StoredResponse | None:
        """The entry, refreshed as recently used; None when unknown, expired or another tenant's."""
        with self._lock:
            now = self.clock()
            self._expire(now)
            entry = self._entries.get(response_id)
            if entry is None or entry.tenant != tenant:
                return None
            entry.used = now
            self._entries.move_to_end(response_id)
            return entry

    def delete(self, response_id: str, tenant: str) -> bool:
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is None or entry.tenant != tenant:
                return False
            del self._entries[response_id]
            return True

    def __len__(self) -> int:
        return len(self._entries)

    def _expire(self, now: float) -> None:
        # Least recently used first: stop at the first entry still fresh.
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if now - entry.used <= self.ttl_s:
                break
            del self._entries[key]
