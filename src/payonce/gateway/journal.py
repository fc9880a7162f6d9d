"""The events of every stream a gateway relays, written to the store together.

At token rate a stream has an event or two to record every ``FLUSH_SECONDS``;
written by each stream on its own, that is a task waking, a chain of coroutines
and a store call per stream per flush, and on a busy gateway these writes were
most of what recording cost (benchmarks/NOTEBOOK.md, "Streams at token rate,
counted"). Here the streams with events due wait for one tick, and one store
call writes them all (:class:`~payonce.store.AppendsMany`: SQLite queues every
statement into one transaction; other stores get the appends side by side).
Each stream's events are still fenced by its own token, and a follower in
another process sees them as soon as before: at most ``FLUSH_SECONDS`` after
they arrived, plus the store's commit.

What the journal does not do stays with each stream's recorder
(:mod:`payonce.gateway.recording`): writing the stream's head, writing what is
left at its end, and retrying through a store outage. A write that fails hands
the stream back to its recorder, which retries on its own schedule.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

from payonce.errors import StorageError
from payonce.store import Append, AppendsMany, Store

__all__ = ["FLUSH_SECONDS", "Journal", "Journaled"]

log = logging.getLogger("payonce.gateway")

# How long events may wait to be written (a tick of the journal).
FLUSH_SECONDS = 0.05


class Journaled(Protocol):
    """A stream's recorder, as the journal sees it."""

    def take_due(self) -> Append | None:
        """The events to write now, or ``None`` (nothing, or its recorder is writing)."""
        ...

    def settle(self, appended: bool | None, error: StorageError | None) -> None:
        """What became of the events taken: written (True), fenced out (False), failed
        (``error``), or unknown (``None`` and no error: the write was cancelled)."""
        ...


class Journal:
    """The streams of one gateway with events due, written once per tick."""

    def __init__(self, store: Store, tick: float = FLUSH_SECONDS) -> None:
        self.store = store
        self.tick = tick
        self._due: dict[Journaled, None] = {}  # in order, once each
        self._timer: asyncio.TimerHandle | None = None
        self._writing: set[asyncio.Task[None]] = set()

    def due(self, recorder: Journaled) -> None:
        """Write ``recorder``'s events at the next tick (at most ``tick`` from now)."""
        self._due[recorder] = None
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.tick, self._flush)

    def _flush(self) -> None:
        self._timer = None
        due, self._due = self._due, {}
        taken = [(recorder, append) for recorder in due if (append := recorder.take_due())]
        if taken:
            task = asyncio.get_running_loop().create_task(self._write(taken))
            self._writing.add(task)  # held until done: the loop keeps only a weak reference
            task.add_done_callback(self._writing.discard)

    async def _write(self, taken: Sequence[tuple[Journaled, Append]]) -> None:
        appends = [append for _, append in taken]
        outcomes: Sequence[bool | BaseException]
        try:
            if isinstance(self.store, AppendsMany):
                try:
                    outcomes = await self.store.append_events_many(appends)
                except StorageError as exc:
                    outcomes = [exc] * len(taken)
            else:
                # Side by side, each with its own outcome.
                writes = (self.store.append_events(*append) for append in appends)
                outcomes = await asyncio.gather(*writes, return_exceptions=True)
        except BaseException:
            for recorder, _ in taken:
                recorder.settle(None, None)
            raise
        for (recorder, _), outcome in zip(taken, outcomes, strict=True):
            if isinstance(outcome, StorageError):
                recorder.settle(None, outcome)
            elif isinstance(outcome, BaseException):
                log.error("recording the events of a stream failed", exc_info=outcome)
                recorder.settle(None, None)
            else:
                recorder.settle(outcome, None)
