"""Replays served from memory: completed responses ready to send, and batched replay counts.

A completed record never changes until it expires, so a process may keep a copy
and answer duplicates without touching the store, even when several processes
share it. The copy holds the response as the ASGI messages it is sent as, so a
replay costs two ``send`` calls. Counting each replay with a store write would
cost more than the replay itself; counts are summed here and flushed in batches.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

from payonce.clock import Clock
from payonce.errors import StoreUnavailable
from payonce.gateway.observing import UpstreamFacts
from payonce.store import Store, StoredResponse

__all__ = ["CachedReplay", "ReplayCache", "ReplayCounter"]

log = logging.getLogger("payonce.gateway")

REPLAYED = (b"idempotent-replayed", b"true")


@dataclass(slots=True)
class CachedReplay:
    """A completed response; its ASGI messages are built on the first replay, then reused."""

    fingerprint: str
    expires_at: float
    response: StoredResponse
    facts: UpstreamFacts | None = None  # what the original call cost, for the call log
    _messages: tuple[dict[str, object], dict[str, object]] | None = None

    @property
    def messages(self) -> tuple[dict[str, object], dict[str, object]]:
        """``http.response.start`` (headers included) and ``http.response.body``."""
        if self._messages is None:
            response = self.response
            headers = [
                (name.encode("latin-1"), value.encode("latin-1"))
                for name, value in response.headers
            ]
            headers.append(REPLAYED)
            headers.append((b"content-length", str(len(response.body)).encode()))
            start = {"type": "http.response.start", "status": response.status, "headers": headers}
            self._messages = (start, {"type": "http.response.body", "body": response.body})
        return self._messages


class ReplayCache:
    """Least-recently-used completed responses, bounded by their total body size."""

    def __init__(self, clock: Clock, max_bytes: int) -> None:
        self._clock = clock
        self._max_bytes = max_bytes
        self._bytes = 0
        self._entries: OrderedDict[tuple[str, str], CachedReplay] = OrderedDict()

    def get(self, tenant: str, key: str) -> CachedReplay | None:
        entry = self._entries.get((tenant, key))
        if entry is None:
            return None
        if entry.expires_at <= self._clock.now():
            self._drop((tenant, key))
            return None
        self._entries.move_to_end((tenant, key))
        return entry

    def put(
        self,
        tenant: str,
        key: str,
        fingerprint: str,
        expires_at: float,
        response: StoredResponse,
        facts: UpstreamFacts | None = None,
    ) -> CachedReplay:
        """Remember a completed response; return the entry (cached or not, if too big)."""
        entry = CachedReplay(fingerprint, expires_at, response, facts)
        size = len(response.body)
        # A few huge bodies must not flush everything else.
        if self._max_bytes == 0 or size > self._max_bytes // 8:
            return entry
        name = (tenant, key)
        self._drop(name)
        self._entries[name] = entry
        self._bytes += size
        while self._bytes > self._max_bytes:
            self._drop(next(iter(self._entries)))
        return entry

    def _drop(self, name: tuple[str, str]) -> None:
        entry = self._entries.pop(name, None)
        if entry is not None:
            self._bytes -= len(entry.response.body)

    def __len__(self) -> int:
        return len(self._entries)


class ReplayCounter:
    """Replays answered since the last flush, by ``(tenant, key)``."""

    def __init__(self) -> None:
        self._pending: dict[tuple[str, str], int] = {}

    def add(self, tenant: str, key: str, count: int = 1) -> None:
        name = (tenant, key)
        self._pending[name] = self._pending.get(name, 0) + count

    def pending(self, tenant: str, key: str) -> int:
        return self._pending.get((tenant, key), 0)

    async def flush(self, store: Store) -> None:
        if not self._pending:
            return
        batch, self._pending = self._pending, {}
        try:
            await store.add_replays(batch)
        except StoreUnavailable as exc:
            # Counts are statistics: keep them for the next flush rather than fail.
            for (tenant, key), count in batch.items():
                self.add(tenant, key, count)
            log.warning("could not record replay counts: %s", exc)
