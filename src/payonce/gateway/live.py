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
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable

__all__ = ["Backlog", "LiveStream", "Push"]

log = logging.getLogger("payonce.gateway")

# A follower sends at most this many events at once: a slow reader catching up
# must not build one huge response chunk.
MAX_BATCH = 256

# Reads recorded events numbered above the first argument and up to the second.
Backlog = Callable[[int, int], Awaitable[list[bytes]]]


# Writes events numbered after the int (framed as the follower frames them) to a
# client at once; False when it cannot without waiting (:meth:`LiveStream.follow`).
Push = Callable[[list[bytes], int], bool]


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
        # Futures of the tasks waiting for the next change (followers and observers).
        self._waiters: list[asyncio.Future[None]] = []
        # Where each follower is; a pushed follower's entry is written only when
        # it is released (it is at the end meanwhile, moved on by every push).
        self._positions: dict[int, int] = {}
        # Followers at the end of the stream that take new events as they come,
        # without their task waking (:meth:`follow`): their push, and the future
        # that wakes them when a push cannot be made or the stream ends.
        self._pushed: dict[int, tuple[Push, asyncio.Future[None]]] = {}
        # The same followers and pushes as a list, made again at each change (rare)
        # rather than at each append: append goes through it once per event.
        self._pushes: list[tuple[int, Push]] = []
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
        # Once per upstream read: ``total`` and the push loop are spelled out here,
        # two calls fewer per streamed event (benchmarks/NOTEBOOK.md).
        before = self.base + len(self.events)
        self.events.extend(events)
        # Every pushed follower is at ``before``, the end: it was registered there
        # (:meth:`follow`) and each push it took moved it on to the new end. The
        # list is the one of the moment: a release makes another.
        for follower, push in self._pushes:
            try:
                pushed = push(events, before)
            except Exception:  # a client's connection must never stop the run
                log.debug("pushing events to a follower failed", exc_info=True)
                pushed = False
            if not pushed:
                self._release(follower, before)  # its task sends them, with a send that waits
        if self._waiters:  # mostly none: the followers that keep up are pushed to
            self._wake()

    def _release(self, follower: int, position: int) -> None:
        """Wake a pushed follower's task at ``position``: it takes over from there."""
        self._positions[follower] = position
        _, waiter = self._pushed.pop(follower)
        self._listed()
        if not waiter.done():
            waiter.set_result(None)

    def _listed(self) -> None:
        self._pushes = [(follower, push) for follower, (push, _) in self._pushed.items()]

    def finish(self, *, failed: bool = False) -> None:
        self.finished = True
        self.failed = failed
        for follower in list(self._pushed):
            self._release(follower, self.total)
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
        await self._wait()

    async def _wait(self, follower: int | None = None, push: Push | None = None) -> None:
        """Until the next change, or with ``push``, until ``follower`` must take over."""
        waiter = asyncio.get_running_loop().create_future()
        if push is not None and follower is not None:
            self._pushed[follower] = (push, waiter)
            self._listed()
        else:
            self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if follower is not None and self._pushed.pop(follower, None) is not None:
                self._listed()  # cancelled while pushed (the client left)
            if not waiter.done():
                waiter.cancel()

    def _wake(self) -> None:
        waiters = self._waiters
        if waiters:
            self._waiters = []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def follow(
        self, after: int = 0, push: Push | None = None
    ) -> AsyncGenerator[tuple[int, list[bytes]]]:
        """Batches of events numbered above ``after``, until the stream ends, each with
        the number of the event before it.

        With ``push``, a follower that has caught up takes each new batch through
        it as the run appends it, in the run's task: its own task sleeps until a
        push cannot be made (the client reads slowly: the events are then yielded
        from where it is) or the stream ends. Raises :class:`ConnectionError`
        after the last batch if the upstream died.
        """
        follower = next(self._ids)
        position = after
        positions = self._positions
        positions[follower] = position
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
                    await self._wait(follower, push)
                    position = positions[follower]  # pushes moved it on, its release wrote it
                    continue
                before = position
                position += len(batch)
                positions[follower] = position
                yield before, batch
        finally:
            del positions[follower]
