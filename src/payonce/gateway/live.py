"""A stream in progress in this process, that any number of clients follow.

The run that reads the upstream appends each event here as it arrives; every
client of the key (the first one and any duplicate, early or late) reads the
same list from its own position and then waits for more. Events stay in memory
only while the stream runs, for late joiners; the store keeps the durable copy.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

__all__ = ["LiveStream"]


class LiveStream:
    """Status, headers and the events so far of one upstream stream."""

    def __init__(self, status: int, headers: tuple[tuple[str, str], ...]) -> None:
        self.status = status
        self.headers = headers
        self.events: list[bytes] = []
        self.finished = False
        self.failed = False
        self._changed = asyncio.Event()

    def append(self, events: list[bytes]) -> None:
        self.events.extend(events)
        self._wake()

    def finish(self, *, failed: bool = False) -> None:
        self.finished = True
        self.failed = failed
        self._wake()

    def _wake(self) -> None:
        # One event object per generation of waiters: set it, then start a new one.
        self._changed.set()
        self._changed = asyncio.Event()

    async def follow(self, after: int = 0) -> AsyncIterator[list[bytes]]:
        """Batches of events numbered above ``after``, until the stream ends.

        Raises :class:`ConnectionError` after the last batch if the upstream died.
        """
        position = after
        while True:
            if position < len(self.events):
                batch = self.events[position:]
                position += len(batch)
                yield batch
                continue
            if self.finished:
                if self.failed:
                    raise ConnectionError("the upstream stream ended before completing")
                return
            await self._changed.wait()
