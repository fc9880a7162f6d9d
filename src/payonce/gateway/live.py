"""A stream in progress in this process, that any number of clients follow.

The run that reads the upstream appends each event here as it arrives; every
client of the key (the first one and any duplicate, early or late) reads from
its own position and then waits for more.

Memory holds only a window: once events are recorded in the store,
:meth:`trim` lets them go. A follower that is (or joins) behind the window
reads the missing events back from the store, so two hundred streams of a
thousand events do not all sit in memory at once, however slow their readers.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncGenerator, Awaitable, Callable

__all__ = ["Backlog", "LiveStream"]

# A follower sends at most this many events at once: a slow reader catching up
# must not build one huge response chunk.
MAX_BATCH = 256

# Reads recorded events numbered above the first argument and up to the second.
Backlog = Callable[[int, int], Awaitable[list[bytes]]]


class LiveStream:
    """Status, headers and the not-yet-trimmed events of one upstream stream."""

    def __init__(
        self, status: int, headers: tuple[tuple[str, str], ...], backlog: Backlog | None = None
    ) -> None:
        self.status = status
        self.headers = headers
        self.base = 0  # events numbered up to here have left memory
        self.events: list[bytes] = []  # events numbered base + 1, base + 2, ...
        self.finished = False
        self.failed = False
        self._backlog = backlog
        self._changed = asyncio.Event()
        self._positions: dict[int, int] = {}
        self._ids = itertools.count()

    @property
    def followers(self) -> int:
        """Clients relaying this stream right now."""
        return len(self._positions)

    @property
    def total(self) -> int:
        """Events received so far."""
        return self.base + len(self.events)

    def append(self, events: list[bytes]) -> None:
        self.events.extend(events)
        self._wake()

    def finish(self, *, failed: bool = False) -> None:
        self.finished = True
        self.failed = failed
        self._wake()

    def trim(self, recorded: int) -> None:
        """Forget events numbered up to ``recorded``: the store has them now.

        A follower still behind them (a slow reader, a late joiner) reads them
        back from the store, so memory stays bounded by what is not yet recorded
        rather than by the slowest client.
        """
        if self._backlog is not None and recorded > self.base:
            del self.events[: recorded - self.base]
            self.base = recorded

    async def changed(self) -> None:
        """Return at the next change: new events, or the stream's end.

        For observers that relay nothing (the status endpoint's ``?wait=``): unlike
        :meth:`follow`, waiting here does not count as a follower.
        """
        await self._changed.wait()

    def _wake(self) -> None:
        # One event object per generation of waiters: set it, then start a new one.
        self._changed.set()
        self._changed = asyncio.Event()

    async def follow(self, after: int = 0) -> AsyncGenerator[list[bytes]]:
        """Batches of events numbered above ``after``, until the stream ends.

        Raises :class:`ConnectionError` after the last batch if the upstream died.
        """
        follower = next(self._ids)
        position = after
        self._positions[follower] = position
        try:
            while True:
                if position < self.base:
                    assert self._backlog is not None
                    batch = await self._backlog(position, min(self.base, position + MAX_BATCH))
                    if not batch:
                        raise ConnectionError("recorded events are missing from the store")
                elif position < self.total:
                    start = position - self.base
                    batch = self.events[start : start + MAX_BATCH]
                elif self.finished:
                    if self.failed:
                        raise ConnectionError("the upstream stream ended before completing")
                    return
                else:
                    await self._changed.wait()
                    continue
                position += len(batch)
                self._positions[follower] = position
                yield batch
        finally:
            del self._positions[follower]
