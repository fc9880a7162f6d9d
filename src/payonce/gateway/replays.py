"""Replays served from memory: completed responses ready to send, and batched replay counts.

A completed record never changes until it expires, so a process may keep a copy
and answer duplicates without touching the store, even when several processes
share it. The copy holds the response as the ASGI messages it is sent as, so a
replay costs two ``send`` calls. Counting each replay with a store write would
cost more than the replay itself; counts are summed here and flushed in batches.
"""

from __future__ import annotations

import collections
import heapq
import logging
import secrets
from collections import OrderedDict
from dataclasses import dataclass

from payonce.clock import Clock
from payonce.errors import StorageError
from payonce.gateway.observing import UpstreamFacts
from payonce.store import Store, StoredResponse

__all__ = ["CachedReplay", "ReplayCache", "ReplayCounter", "entry_cost"]

log = logging.getLogger("payonce.gateway")

REPLAYED = (b"idempotent-replayed", b"true")
# Failed flushes of replay counts kept to be sent again (ReplayCounter).
MAX_FAILED_BATCHES = 600


# What an entry costs beyond the lengths of its strings and body, measured with
# tracemalloc over 20,000 entries (tests/gateway/test_replay_cache.py checks the
# charge against a fresh measurement). The fixed part is the entry's objects (the
# entry, its StoredResponse and UpstreamFacts, fingerprint, key, the dict slot,
# its expiry-heap item, ~700 bytes) plus the two ASGI messages built on its first
# replay (~600 bytes), charged up front so the budget holds whether it is
# replayed or not. A header is kept twice: as str pairs and as the bytes pairs it
# is sent as (~150 bytes of objects each time, plus its characters).
ENTRY_COST = 1280
HEADER_COST = 310
_STR_COST = 49  # an ASCII str object without its characters (model, request id)
_USAGE_COST = 184  # an empty usage dict (a few keys); each count adds an int


def entry_cost(key: str, response: StoredResponse, facts: UpstreamFacts | None) -> int:
    """The memory an entry takes, in bytes: what the cache's budget is charged."""
    cost = ENTRY_COST + len(key) + len(response.body)
    for name, value in response.headers:
        cost += HEADER_COST + 2 * (len(name) + len(value))
    if facts is not None:
        if facts.model is not None:
            cost += _STR_COST + len(facts.model)
        if facts.request_id is not None:
            cost += _STR_COST + len(facts.request_id)
        if facts.usage is not None:
            cost += _USAGE_COST + 32 * len(facts.usage)
    return cost


@dataclass(slots=True)
class CachedReplay:
    """A completed response; its ASGI messages are built on the first replay, then reused."""

    fingerprint: str
    expires_at: float
    response: StoredResponse
    facts: UpstreamFacts | None = None  # what the original call cost, for the call log
    _messages: tuple[dict[str, object], dict[str, object]] | None = None
    size: int = 0  # what the cache charged for it (entry_cost)

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
    """Least-recently-used completed responses, bounded by what they take in memory.

    Each entry is charged :func:`entry_cost` (body, headers, key and bookkeeping),
    so thousands of empty responses cannot outgrow the budget. Expired entries
    are dropped when looked up and by :meth:`evict_expired`, which the gateway's
    housekeeping calls every second: a heap ordered by expiry finds them without
    a scan, so each put stays O(log n) and each get O(1).
    """

    def __init__(self, clock: Clock, max_bytes: int) -> None:
        self._clock = clock
        self._max_bytes = max_bytes
        self._bytes = 0
        self._entries: OrderedDict[tuple[str, str], CachedReplay] = OrderedDict()
        # (expires_at, name) of every entry put; items of entries since dropped or
        # replaced stay until they reach the top or the heap is rebuilt.
        self._expiries: list[tuple[float, tuple[str, str]]] = []

    @property
    def charged(self) -> int:
        """Bytes charged to the budget by the entries held now."""
        return self._bytes

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
        if self._max_bytes == 0:
            return entry
        size = entry.size = entry_cost(key, response, facts)
        # A few huge bodies must not flush everything else.
        if size > self._max_bytes // 8:
            return entry
        name = (tenant, key)
        self._drop(name)
        self._entries[name] = entry
        self._bytes += size
        heapq.heappush(self._expiries, (expires_at, name))
        while self._bytes > self._max_bytes:
            self._drop(next(iter(self._entries)))
        if len(self._expiries) > 2 * len(self._entries) + 64:
            # Mostly items of entries already gone (LRU evictions): rebuild, O(n)
            # once per n puts, so the heap stays within twice the entries.
            self._expiries = [(e.expires_at, n) for n, e in self._entries.items()]
            heapq.heapify(self._expiries)
        return entry

    def evict_expired(self) -> int:
        """Drop every entry past its expiry; return how many went."""
        now = self._clock.now()
        expiries, entries = self._expiries, self._entries
        dropped = 0
        while expiries and expiries[0][0] <= now:
            _, name = heapq.heappop(expiries)
            entry = entries.get(name)
            if entry is not None and entry.expires_at <= now:
                self._drop(name)
                dropped += 1
        return dropped

    def _drop(self, name: tuple[str, str]) -> None:
        entry = self._entries.pop(name, None)
        if entry is not None:
            self._bytes -= entry.size

    def __len__(self) -> int:
        return len(self._entries)


class ReplayCounter:
    """Replays answered since the last flush, by ``(tenant, key)``.

    A flush that failed is sent again as it was, under its batch name, so a store
    whose failed write was applied after all (a Redis timeout) adds it once. At
    most :data:`MAX_FAILED_BATCHES` wait (a flush a second: ten minutes of an
    outage); past that the oldest is dropped, and said so.
    """

    def __init__(self) -> None:
        self._pending: dict[tuple[str, str], int] = {}
        self._failed: collections.deque[tuple[str, dict[tuple[str, str], int]]] = (
            collections.deque()
        )

    def add(self, tenant: str, key: str, count: int = 1) -> None:
        name = (tenant, key)
        self._pending[name] = self._pending.get(name, 0) + count

    def pending(self, tenant: str, key: str) -> int:
        name = (tenant, key)
        return self._pending.get(name, 0) + sum(batch.get(name, 0) for _, batch in self._failed)

    async def flush(self, store: Store) -> None:
        if self._pending:
            self._failed.append((secrets.token_hex(8), self._pending))
            self._pending = {}
        while self._failed:
            name, batch = self._failed[0]
            try:
                await store.add_replays(batch, batch=name)
            except StorageError as exc:
                # Counts are statistics: keep them for the next flush rather than fail.
                while len(self._failed) > MAX_FAILED_BATCHES:
                    _, dropped = self._failed.popleft()
                    log.warning("dropped %d replay counts kept too long", sum(dropped.values()))
                log.warning("could not record replay counts: %s", exc)
                return
            self._failed.popleft()
