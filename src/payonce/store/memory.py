"""``memory://``: records in a dict. One process, gone on restart; for tests and trials."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Collection, Mapping, Sequence

from payonce.clock import Clock, SystemClock
from payonce.store.base import (
    Appended,
    Claim,
    ClaimStatus,
    Record,
    RecordState,
    StoredResponse,
    held_expiry,
    new_token,
)
from payonce.store.waiters import Waiters

__all__ = ["MemoryStore"]


class MemoryStore:
    """The :class:`payonce.store.base.Store` protocol in memory.

    Each method runs without awaiting between its read and its write, so on one
    event loop every operation is atomic. Writers wake :meth:`wait` at once;
    ``poll_interval`` bounds how late it notices a lease that lapsed because
    the clock jumped.
    """

    def __init__(self, clock: Clock | None = None, *, poll_interval: float = 0.25) -> None:
        self._clock = clock or SystemClock()
        self._poll_interval = poll_interval
        self._records: dict[tuple[str, str], Record] = {}
        self._events: dict[tuple[str, str], list[bytes]] = {}
        self._waiters = Waiters()

    def _live(self, tenant: str, key: str) -> Record | None:
        record = self._records.get((tenant, key))
        if record is not None and record.expired(self._clock.now()):
            del self._records[(tenant, key)]
            self._events.pop((tenant, key), None)
            return None
        return record

    async def claim(
        self, tenant: str, key: str, fingerprint: str, *, lease: float, ttl: float
    ) -> Claim:
        now = self._clock.now()
        record = self._live(tenant, key)
        if record is not None:
            if record.fingerprint != fingerprint:
                return Claim(ClaimStatus.MISMATCH, record)
            if record.state is RecordState.COMPLETED:
                return Claim(ClaimStatus.COMPLETED, record)
            if record.lease_expires_at > now:
                return Claim(ClaimStatus.IN_PROGRESS, record)
        record = Record(
            tenant=tenant,
            key=key,
            fingerprint=fingerprint,
            state=RecordState.IN_PROGRESS,
            token=new_token(),
            created_at=now,
            lease_expires_at=now + lease,
            expires_at=held_expiry(now + lease, lease, now + ttl),
        )
        self._records[(tenant, key)] = record
        self._events.pop((tenant, key), None)
        return Claim(ClaimStatus.ACQUIRED, record)

    def _held(self, tenant: str, key: str, token: str) -> Record | None:
        record = self._live(tenant, key)
        if record is None or record.token != token or record.state is not RecordState.IN_PROGRESS:
            return None
        return record

    async def renew(self, tenant: str, key: str, token: str, *, lease: float) -> bool:
        record = self._held(tenant, key, token)
        if record is None:
            return False
        lease_end = self._clock.now() + lease
        self._records[(tenant, key)] = dataclasses.replace(
            record,
            lease_expires_at=lease_end,
            expires_at=held_expiry(lease_end, lease, record.expires_at),
        )
        return True

    async def complete(
        self,
        tenant: str,
        key: str,
        token: str,
        response: StoredResponse,
        *,
        usage: Mapping[str, int] | None = None,
        cost_usd: float | None = None,
        replays: int = 0,
        ttl: float,
    ) -> bool:
        record = self._held(tenant, key, token)
        if record is None:
            return False
        now = self._clock.now()
        self._records[(tenant, key)] = dataclasses.replace(
            record,
            state=RecordState.COMPLETED,
            response=response,
            completed_at=now,
            expires_at=now + ttl,
            usage=dict(usage) if usage is not None else None,
            events=len(self._events.get((tenant, key), ())) if response.stream else 0,
            cost_usd=cost_usd,
            replays=record.replays + replays,
        )
        self._waiters.notify(f"{tenant}\x00{key}")
        return True

    async def release(self, tenant: str, key: str, token: str) -> bool:
        if self._held(tenant, key, token) is None:
            return False
        del self._records[(tenant, key)]
        self._events.pop((tenant, key), None)
        self._waiters.notify(f"{tenant}\x00{key}")
        return True

    async def begin_stream(
        self, tenant: str, key: str, token: str, status: int, headers: tuple[tuple[str, str], ...]
    ) -> bool:
        record = self._held(tenant, key, token)
        if record is None:
            return False
        head = StoredResponse(status, headers, b"", stream=True)
        self._records[(tenant, key)] = dataclasses.replace(record, response=head, events=0)
        self._events[(tenant, key)] = []
        return True

    async def append_events(
        self, tenant: str, key: str, token: str, first: int, events: Sequence[bytes]
    ) -> Appended:
        record = self._held(tenant, key, token)
        if record is None:
            return Appended.LOST
        recorded = self._events.setdefault((tenant, key), [])
        del recorded[first - 1 :]
        recorded.extend(events)
        self._records[(tenant, key)] = dataclasses.replace(record, events=len(recorded))
        self._waiters.notify(f"{tenant}\x00{key}")
        return Appended.WRITTEN  # one process: its followers read the stream live

    async def watched_runs(self, runs: Collection[tuple[str, str]]) -> set[tuple[str, str]]:
        return set()  # one process: no follower elsewhere

    async def read_events(self, tenant: str, key: str, after: int = 0) -> list[bytes]:
        if self._live(tenant, key) is None:
            return []
        return self._events.get((tenant, key), [])[after:]

    async def add_replays(self, counts: Mapping[tuple[str, str], int], *, batch: str = "") -> None:
        # A failed call here changed nothing, so a batch sent again is new: no names kept.
        for (tenant, key), count in counts.items():
            record = self._live(tenant, key)
            if record is not None and record.state is RecordState.COMPLETED:
                self._records[(tenant, key)] = dataclasses.replace(
                    record, replays=record.replays + count
                )

    async def get(self, tenant: str, key: str) -> Record | None:
        return self._live(tenant, key)

    async def wait(self, tenant: str, key: str, timeout: float) -> Record | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        first = self._live(tenant, key)
        record = first
        while True:
            if record is None or record.state is RecordState.COMPLETED:
                return record
            if first is not None and (record.token != first.token or record.events != first.events):
                return record
            now = self._clock.now()
            remaining = deadline - loop.time()
            if record.lease_lapsed(now) or remaining <= 0:
                return record
            # A dead holder never notifies: wake up when its lease runs out at the
            # latest, and re-read now and then in case the clock jumped (a test's
            # manual clock, a stepped system clock) or the holder renewed.
            step = min(remaining, record.lease_expires_at - now, self._poll_interval)
            await self._waiters.wait(f"{tenant}\x00{key}", step)
            record = self._live(tenant, key)

    async def purge_expired(self, limit: int | None = None) -> int:
        now = self._clock.now()
        expired = [name for name, record in self._records.items() if record.expired(now)]
        if limit is not None:
            del expired[limit:]
        for name in expired:
            del self._records[name]
            self._events.pop(name, None)
        return len(expired)

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        self._records.clear()
        self._events.clear()
