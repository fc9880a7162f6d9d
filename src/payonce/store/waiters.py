"""In-process wake-ups for :meth:`Store.wait`: one shared future per awaited record."""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["Waiters"]


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
