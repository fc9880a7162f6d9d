"""This process's hold on one key: every fenced write of a run goes through its :class:`Lease`.

A run that won a claim holds the key under a fencing token until its lease
ends (renewed a third of a lease at a time while it runs). The lease carries
what each write needs (the store, tenant, key, token, ``--lease``, ``--ttl``)
and what this process knows of the record's times, so no call site passes
them loose, and the rule on those times lives here only:

- ``lease_ends_at``: when the lease lapses unless renewed;
- ``expires_at``: the record's expiry, never inside a live lease
  (:func:`payonce.store.held_expiry`): at least one lease past its end while
  the run holds it, then ``ttl`` after the answer once it is stored.

Both are read from the store's clock *before* each write, so they are never
later than what the store keeps: a pending write gives up by ``expires_at``,
and the replay cache keeps an answer no longer than the store does.

A write the store could not take (:class:`~payonce.errors.StorageError`) is
either raised (:meth:`complete`, :meth:`release`) or, through the
``*_or_retry`` forms, left to :class:`~payonce.gateway.pending.PendingWrites`,
which writes it once the store is back, while the record's expiry allows.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from payonce.clock import Clock
from payonce.errors import StorageError
from payonce.gateway.pending import PendingWrites
from payonce.store import Appended, Record, Store, StoredResponse, held_expiry

__all__ = ["Lease"]

log = logging.getLogger("payonce.gateway")


@dataclass(slots=True, eq=False)
class Lease:
    """The claim this process won on ``(tenant, key)``, and its fenced writes.

    Every write succeeds only while ``token`` is the record's current one and
    the record is in progress (it returns ``False`` otherwise: another holder
    took the key over after the lease lapsed, and nothing of this run may be
    stored).
    """

    store: Store
    clock: Clock
    tenant: str
    key: str
    token: str
    duration: float  # --lease, seconds
    ttl: float  # --ttl: how long a stored answer is replayed
    lease_ends_at: float
    expires_at: float
    pending: PendingWrites | None = field(default=None, repr=False)

    @classmethod
    def of(
        cls,
        store: Store,
        claimed: Record,
        *,
        clock: Clock,
        duration: float,
        ttl: float,
        pending: PendingWrites | None = None,
    ) -> Lease:
        """The lease of a record :meth:`Store.claim` returned ACQUIRED."""
        return cls(
            store,
            clock,
            claimed.tenant,
            claimed.key,
            claimed.token,
            duration,
            ttl,
            claimed.lease_expires_at,
            # A store keeps it there already; an older record may not have.
            held_expiry(claimed.lease_expires_at, duration, claimed.expires_at),
            pending,
        )

    def until(self) -> float:
        """The record's expiry as known now: pending writes of this run give up by it."""
        return self.expires_at

    async def renew(self) -> bool:
        """Extend the lease to ``duration`` from now; the expiry moves on with it.

        Raises :class:`StorageError` when the store cannot answer (the lease is
        unchanged; the next renewal tries again).
        """
        lease_end = self.clock.now() + self.duration
        held = await self.store.renew(self.tenant, self.key, self.token, lease=self.duration)
        if held:
            self.lease_ends_at = lease_end
            self.expires_at = held_expiry(lease_end, self.duration, self.expires_at)
        return held

    async def begin_stream(self, status: int, headers: tuple[tuple[str, str], ...]) -> bool:
        """Record the head of the stream this run relays (:meth:`Store.begin_stream`)."""
        return await self.store.begin_stream(self.tenant, self.key, self.token, status, headers)

    async def append(self, first: int, events: Sequence[bytes]) -> Appended:
        """Record events numbered ``first``, ``first + 1``, ... (:meth:`Store.append_events`)."""
        return await self.store.append_events(self.tenant, self.key, self.token, first, events)

    async def complete(
        self,
        response: StoredResponse,
        *,
        usage: Mapping[str, int] | None,
        cost_usd: float | None,
        replays: int,
    ) -> bool:
        """Store the answer; from then on it is replayed for ``ttl``."""
        completing = self.clock.now()  # before the store's reading: never past its expiry
        stored = await self.store.complete(
            self.tenant,
            self.key,
            self.token,
            response,
            usage=usage,
            cost_usd=cost_usd,
            replays=replays,
            ttl=self.ttl,
        )
        if stored:
            self.expires_at = completing + self.ttl
        return stored

    async def complete_or_retry(
        self,
        response: StoredResponse,
        *,
        usage: Mapping[str, int] | None,
        cost_usd: float | None,
        replays: int,
    ) -> bool | None:
        """:meth:`complete`; ``None`` when the store is down (the write is retried later).

        The client has its answer anyway; once the store is back the answer is
        stored (gateway/pending.py), or, if that comes after the record's
        expiry, the lease lapses and a later retry runs again.
        """
        complete = functools.partial(
            self.complete, response, usage=usage, cost_usd=cost_usd, replays=replays
        )
        try:
            return await complete()
        except StorageError as exc:
            log.error("could not store the result of key %r (retried later): %s", self.key, exc)
            if self.pending is not None:
                self.pending.add("complete", self.key, complete, self.until)
            return None

    async def release(self) -> bool:
        """Give the key up without an answer: the next claim runs the request again."""
        return await self.store.release(self.tenant, self.key, self.token)

    async def release_or_retry(self) -> None:
        """:meth:`release`; when the store is down, the release is retried later."""
        try:
            await self.release()
        except StorageError as exc:
            log.error(
                "could not release key %r (retried when the store is back): %s", self.key, exc
            )
            if self.pending is not None:
                self.pending.add("release", self.key, self.release, self.until)
