"""Starting the timed stream writes that fall due in the same instant a few per loop turn.

Streams that began together are written together: a thousand quiet streams
(``recording.QUIET_SECONDS``) whose timers fall due in the same instant would
each start its write in one loop turn. Each start is about 50k instructions of
Python (the writer's wake-up, the lease, the store, the group commit), so that
turn lasts 20 ms and more, and every client of the process waits it out between
two events (benchmarks/NOTEBOOK.md, "Timed writes a few a turn"; workload 5
spreads its timers over its first second and never showed it). So a writer
whose timer fires queues here, and each loop turn starts at most ``PER_TURN`` of
them, in the order they fell due; the relay runs between. The last of a
thousand starts some 16 turns late, a few ms against the quiet interval's second.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import Callable

__all__ = ["PER_TURN", "Pacer", "pacer_for"]

# As the SQLite group commit's DUE_PER_TURN: a chunk that costs a ms or two.
PER_TURN = 64


class Pacer:
    """Runs the callbacks given to :meth:`call` in order, at most ``PER_TURN`` a loop turn."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: deque[Callable[[], object]] = deque()
        self._scheduled = False

    def call(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` in a later loop turn, after those queued before it."""
        self._queue.append(callback)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._run)

    def __len__(self) -> int:
        return len(self._queue)

    def _run(self) -> None:
        queue = self._queue
        try:
            for _ in range(min(PER_TURN, len(queue))):
                queue.popleft()()
        finally:
            # A callback that raised (the loop's handler logs it) stops no other one.
            if queue:
                self._loop.call_soon(self._run)
            else:
                self._scheduled = False


_pacers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Pacer] = weakref.WeakKeyDictionary()


def pacer_for(loop: asyncio.AbstractEventLoop) -> Pacer:
    """The pacer of ``loop`` (made on first use)."""
    pacer = _pacers.get(loop)
    if pacer is None:
        pacer = _pacers[loop] = Pacer(loop)
    return pacer
