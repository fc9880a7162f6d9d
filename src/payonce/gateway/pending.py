"""Completions and releases that failed while the store was down, written once it is back.

A run that finishes during a store outage still answers its client, but the
write that settles its record (``complete`` with the answer, or ``release``
after a failure) cannot be made. The record then stays in progress under a
lease nobody renews::

    t0 claim(token A) ── upstream ── t1 answer: complete(A) fails (store down)
                                     t2 store back ── retry: complete(A) ──► stored
    without the retry:               t0+lease: lease lapses ── next claim runs again

Without a retry the next request with the key waits for the lease to lapse and
then runs the request again: a second bill for a call that was answered. The
retry stores the answer (later requests replay it) or frees the key at once.
It is safe because every write is fenced: once another gateway has taken the
key over (after the lease lapsed), ``complete(A)`` and ``release(A)`` are refused
and nothing is overwritten (:mod:`payonce.store.base`).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from payonce.clock import Clock
from payonce.errors import StorageError

__all__ = ["PendingWrites", "Until"]

log = logging.getLogger("payonce.gateway")

Write = Callable[[], Awaitable[bool]]
# The record's expiry, or a function giving it as this process knows it when the
# write is tried: a running call's expiry moves on with each renewal
# (store/base.py, held_expiry), so one read when its run began may already be past.
Until = float | Callable[[], float]


@dataclass(frozen=True, slots=True)
class _Pending:
    what: str  # "complete" or "release", for the log
    key: str
    write: Write
    until: Until  # give up at this clock time (the record's expiry)

    def expiry(self) -> float:
        return self.until() if callable(self.until) else self.until


class PendingWrites:
    """A bounded queue of fenced writes, retried in order by :meth:`retry`.

    ``limit`` bounds memory during a long outage (a pending ``complete`` holds
    the whole response); past it the oldest write is dropped and its record
    left to its lease.
    """

    def __init__(self, clock: Clock, limit: int = 10_000) -> None:
        self._clock = clock
        self._queue: collections.deque[_Pending] = collections.deque()
        self._limit = limit

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, what: str, key: str, write: Write, until: Until) -> None:
        if len(self._queue) >= self._limit:
            dropped = self._queue.popleft()
            log.warning(
                "too many writes waiting for the store: dropped the %s of key %r",
                dropped.what,
                dropped.key,
            )
        self._queue.append(_Pending(what, key, write, until))

    async def retry(self) -> int:
        """Write what is pending, oldest first; stop at the first failure. Returns writes made."""
        written = 0
        while self._queue:
            pending = self._queue[0]
            if self._clock.now() >= pending.expiry():
                self._queue.popleft()
                log.warning(
                    "gave up the %s of key %r: its record expired", pending.what, pending.key
                )
                continue
            try:
                held = await pending.write()
            except StorageError:
                return written  # still down: the next round tries again
            self._queue.popleft()
            written += 1
            if held:
                log.info(
                    "the %s of key %r was written once the store was back",
                    pending.what,
                    pending.key,
                )
            else:
                log.info(
                    "the %s of key %r was refused once the store was back: the key was"
                    " released, expired or taken over (fencing)",
                    pending.what,
                    pending.key,
                )
        return written
