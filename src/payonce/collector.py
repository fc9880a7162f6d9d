"""When CPython's cycle collector runs in an asyncio server: on a timer, between requests.

The gateway and the simulator both hold thousands of long calls at once, and
both run this (the gateway with its metrics; the simulator without).

The collector stops the event loop while it traverses objects, and by its own
schedule (allocation thresholds) it traverses the young generations whenever a
count of allocations says so, in the middle of whatever request allocated. With
5,000 calls of 30 s in flight each gen-1 collection traversed some 140,000
live objects and stopped the loop for 100-150 ms, every 2 s while the calls were
starting; streams whose first event came during one were that much later. The
count it goes by is net of every deallocation, old objects' included, so a
threshold does not bound the young generation either (benchmarks/NOTEBOOK.md,
"The cycle collector at 5,000 calls in flight"). The simulator on CPython's own
schedule made full collections every 2 s while 5,000 calls were starting (each
when its heap had grown by a quarter), of 28, 74, 148, 196 and 286 ms; they
delayed the first byte of every call it was serving then, the benchmark's
direct ones included (benchmarks/NOTEBOOK.md, "The simulator's own pauses").

So :class:`Collector` collects generations 0 and 1 itself every ``young_every``
seconds (0.1): a young collection then holds at most two periods' survivors,
whatever the allocation rate, and runs as a callback of its own between
requests. The automatic schedule stays on for generation 0 only, as a safety
net for a loop that does not turn. A full collection (generation 2) traverses
everything alive (570 ms with 5,000 calls in flight on the benchmark machine),
so it is rare and waits for a quiet moment: when the heap grew by a quarter
since the last one (CPython's own rule, read here from the allocated blocks),
five minutes have passed, and at most ``QUIET`` calls are in flight (few
calls to delay, and a small heap to traverse); or every half hour whatever
happened. One that came with 5,000 calls in flight stopped the loop for over a
second. What only a full collection frees is cyclic garbage that lived long
enough to be promoted first (200 ms here); a call makes none
(tests/gateway/test_no_cycles.py; a census of 400 calls' garbage found
nothing), so waiting costs memory only where some other path makes cycles.

The timer doubles as a probe of the loop: how late each tick ran is
``payonce_event_loop_lag_seconds``; each collection's pause is
``payonce_gc_pause_seconds`` (docs/observability.md).
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["Collector", "PauseSink"]

YOUNG_EVERY = 0.1
FULL_AFTER = 300.0  # at least this long between full collections...
FULL_GROWTH = 1.25  # ...and only if the heap grew by this much since the last one,
FULL_EVERY = 1800.0  # or this long has passed, whatever the heap did.
QUIET = 10  # a due full collection waits while more calls than this are in flight
# The automatic schedule: generation 0 when 25,000 more objects are alive than at
# the last collection, never generations 1 and 2. A safety net for a loop that does
# not turn: at 7,000 (CPython's 700 times ten) it also fired between the timer's
# collections whenever calls arrived fast (500 a second: twice a period), and each
# call's survivors were traversed twice, there and again by the timer's generation
# 1: 40-45 ms a second of the ramp's 100 (benchmarks/NOTEBOOK.md, "The collector's
# safety net").
THRESHOLDS = (25_000, 1 << 30, 1 << 30)


class PauseSink(Protocol):
    """Where the collector's measurements go (the gateway's metrics)."""

    def observe_gc_pause(self, seconds: float) -> None: ...

    def observe_loop_lag(self, seconds: float) -> None: ...


class Collector:
    """Runs the young collections on a timer and the full ones rarely (see the module).

    ``busy`` counts the calls in flight (the gateway's keyed runs, the simulator's
    generations). ``clock`` (monotonic seconds) and
    ``blocks`` (allocated memory blocks) are injected for the tests; :meth:`tick` is
    one timer step, :meth:`run` the loop.
    """

    def __init__(
        self,
        sink: PauseSink | None = None,
        *,
        young_every: float = YOUNG_EVERY,
        clock: Callable[[], float] = time.monotonic,
        blocks: Callable[[], int] = sys.getallocatedblocks,
        collect: Callable[[int], int] = gc.collect,
        busy: Callable[[], int] = lambda: 0,
    ) -> None:
        self.sink = sink
        self._busy = busy
        self.young_every = young_every
        self._clock = clock
        self._blocks = blocks
        self._collect = collect
        self._last_full = clock()
        self._blocks_after_full = blocks()
        self._started: dict[int, float] = {}
        self.full_collections = 0

    def tick(self) -> int:
        """One step: a young collection, or a full one when it is due. The generation."""
        now = self._clock()
        since = now - self._last_full
        full = since >= FULL_EVERY or (
            since >= FULL_AFTER
            and self._busy() <= QUIET
            and self._blocks() >= self._blocks_after_full * FULL_GROWTH
        )
        generation = 2 if full else 1
        self._collect(generation)
        if full:
            self.full_collections += 1
            self._last_full = self._clock()
            self._blocks_after_full = self._blocks()
        return generation

    def start(self) -> asyncio.Task[None]:
        """Freeze what is alive now and :meth:`run` in a task of the running loop.

        Start-up objects never die: frozen, they are in no collection's traversal.
        """
        gc.collect()
        gc.freeze()
        return asyncio.create_task(self.run())

    async def run(self) -> None:
        """Tick every ``young_every`` seconds until cancelled, with the automatic
        schedule narrowed to generation 0 (restored when it stops)."""
        loop = asyncio.get_running_loop()
        before = gc.get_threshold()
        gc.set_threshold(*THRESHOLDS)
        gc.callbacks.append(self._timed)
        try:
            while True:
                due = loop.time() + self.young_every
                await asyncio.sleep(self.young_every)
                if self.sink is not None:
                    self.sink.observe_loop_lag(max(0.0, loop.time() - due))
                self.tick()
        finally:
            gc.callbacks.remove(self._timed)
            gc.set_threshold(*before)

    def _timed(self, phase: str, info: dict[str, Any]) -> None:
        # Every collection, the automatic ones included: what the loop stood still for.
        generation = info["generation"]
        if phase == "start":
            self._started[generation] = time.perf_counter()
        elif self.sink is not None and generation in self._started:
            self.sink.observe_gc_pause(time.perf_counter() - self._started.pop(generation))
