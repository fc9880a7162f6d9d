"""In-process wake-ups for :meth:`Store.wait`: one shared future per awaited record,
and the wait itself for the stores that read a record to see it change (SQLite,
PostgreSQL)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from payonce.clock import Clock
from payonce.store.base import Record, RecordState

__all__ = ["Waiters", "wait_for_change"]


class Waiters:
    """Lets any number of coroutines wait for a change to one record without polling."""

    def __init__(self) -> None:
        self._futures: dict[str, asyncio.Future[None]] = {}

    async def wait(self, name: str, timeout: float) -> None:
        """Sleep until :meth:`notify` for ``name`` or ``timeout`` seconds, whichever is first."""
        future = self._futures.get(name)
        if future is None or future.done():
            future = asyncio.get_running_loop().create_future()
            self._futures[name] = future
        with contextlib.suppress(TimeoutError):
            # shield: one waiter timing out must not cancel the future the others share
            await asyncio.wait_for(asyncio.shield(future), timeout)

    def notify(self, name: str) -> None:
        future = self._futures.pop(name, None)
        if future is not None and not future.done():
            future.set_result(None)

    def notify_all(self) -> None:
        """Wake every waiter (what they wait for may have changed unseen)."""
        futures, self._futures = self._futures, {}
        for future in futures.values():
            if not future.done():
                future.set_result(None)


async def wait_for_change(
    get: Callable[[], Awaitable[Record | None]],
    sleep: Callable[[float], Awaitable[None]],
    poll_interval: Callable[[], float],
    clock: Clock,
    timeout: float,
) -> Record | None:
    """:meth:`Store.wait` by reading the record (``get``) until it changes.

    Between looks it ``sleep``s, which a writer's wake-up may end early, for at
    most ``poll_interval()`` seconds and never past the lease's end (a lapse is a
    change: nobody runs the key any more) or the timeout.
    """
    deadline = time.monotonic() + timeout
    first: Record | None = None
    while True:
        record = await get()
        if record is None or record.state is RecordState.COMPLETED:
            return record
        if first is None:
            first = record
        elif record.events != first.events or record.token != first.token:
            return record  # new events, or a new holder took the key over
        now = clock.now()
        if record.lease_lapsed(now):
            return record
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return record
        await sleep(min(remaining, poll_interval(), record.lease_expires_at - now))
