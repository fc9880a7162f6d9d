"""Timed stream writes that fall due together start a few a loop turn (gateway/pacing.py).

Streams whose timers fall due together, started in one loop turn, would hold
every client of the process for 20 ms and more between two events at a thousand
streams. The pacer's own rules are pinned first; then the recorder's, with many
real recorders over a store that notes the loop turn each write starts in.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator, Callable, Sequence

from payonce.clock import SystemClock
from payonce.gateway import recording
from payonce.gateway.lease import Lease
from payonce.gateway.live import LiveStream
from payonce.gateway.pacing import PER_TURN, Pacer, pacer_for
from payonce.gateway.recording import record_stream
from payonce.observe.facts import UpstreamFacts
from payonce.store import Appended, MemoryStore


class _Turns:
    """Counts the loop's turns while running: a callback that queues itself again."""

    def __init__(self) -> None:
        self.now = 0
        self._on = False
        self._loop = asyncio.get_running_loop()

    def start(self) -> None:
        self._on = True
        self._loop.call_soon(self._tick)

    def stop(self) -> None:
        self._on = False

    def _tick(self) -> None:
        if self._on:
            self.now += 1
            self._loop.call_soon(self._tick)


async def test_the_pacer_runs_its_callbacks_in_order_a_chunk_a_turn() -> None:
    turns = _Turns()
    pacer = Pacer(asyncio.get_running_loop())
    ran: list[tuple[int, int]] = []  # (callback, turn it ran in)
    count = 3 * PER_TURN + 5
    turns.start()
    for n in range(count):
        pacer.call(lambda n=n: ran.append((n, turns.now)))  # type: ignore[misc]
    while len(ran) < count:
        await asyncio.sleep(0)
    turns.stop()
    assert [n for n, _ in ran] == list(range(count))
    per_turn = collections.Counter(turn for _, turn in ran)
    assert max(per_turn.values()) == PER_TURN
    assert len(per_turn) == 4, "each chunk in a turn of its own"
    assert len(pacer) == 0


async def test_a_callback_that_raises_stops_no_other() -> None:
    loop = asyncio.get_running_loop()
    errors: list[object] = []
    loop.set_exception_handler(lambda _, context: errors.append(context.get("exception")))
    try:
        pacer = Pacer(loop)
        ran: list[int] = []

        def boom() -> None:
            raise RuntimeError("boom")

        pacer.call(boom)
        for n in range(2 * PER_TURN):
            pacer.call(lambda n=n: ran.append(n))  # type: ignore[misc]
        for _ in range(10):
            await asyncio.sleep(0)
        assert ran == list(range(2 * PER_TURN))
        assert [type(e) for e in errors] == [RuntimeError]
        pacer.call(lambda: ran.append(-1))  # and it takes new callbacks after
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert ran[-1] == -1
    finally:
        loop.set_exception_handler(None)


async def test_one_pacer_per_loop() -> None:
    loop = asyncio.get_running_loop()
    assert pacer_for(loop) is pacer_for(loop)


class _NotingStore(MemoryStore):
    """A memory store that notes the loop turn each append starts in."""

    def __init__(self, turns: _Turns) -> None:
        super().__init__()
        self.turns = turns
        self.starts: list[int] = []

    async def append_events(
        self, tenant: str, key: str, token: str, first: int, events: Sequence[bytes]
    ) -> Appended:
        self.starts.append(self.turns.now)
        return await super().append_events(tenant, key, token, first, events)


class _Upstream:
    """An event, another 0.1 s later, then the last after ``pause`` seconds."""

    status = 200
    headers = (("content-type", "text/event-stream"),)

    def __init__(self, pause: float) -> None:
        self.pause = pause

    async def chunks(self, take: Callable[[bytes], bool] | None = None) -> AsyncIterator[bytes]:
        for n in range(3):
            if n:  # the first goes with the stream's head, at once; the second is timed
                await asyncio.sleep(0.1 if n == 1 else self.pause)
            event = b'data: {"n": %d}\n\n' % n
            if take is None or not take(event):
                yield event


async def test_quiet_streams_that_fall_due_together_start_their_writes_a_chunk_a_turn() -> None:
    turns = _Turns()
    store = _NotingStore(turns)
    streams = 3 * PER_TURN + 10
    pause = recording.QUIET_SECONDS + 1.5

    async def one(n: int) -> None:
        claim = await store.claim("tenant", f"key-{n}", "print", lease=30, ttl=600)
        lease = Lease.of(store, claim.record, clock=SystemClock(), duration=30, ttl=600)
        stored = await record_stream(
            lease,
            _Upstream(pause),  # type: ignore[arg-type]
            LiveStream(200, ()),
            strip_usage=False,
            on_last_event=lambda: None,
            joined=lambda: 0,
            facts=UpstreamFacts(),
        )
        assert stored is not None

    runs = [asyncio.create_task(one(n)) for n in range(streams)]
    await asyncio.sleep(0.5)  # every stream has its two events, and its quiet write timed
    assert len(store.starts) == streams, "the head and the first event, at once"
    store.starts.clear()
    turns.start()
    # Past every stream's timer, as a loop turn of a busy gateway may be: they
    # all fall due in the next turn.
    time.sleep(recording.QUIET_SECONDS)  # the loop blocked on purpose
    while len(store.starts) < streams:
        await asyncio.sleep(0.01)
    turns.stop()
    per_turn = collections.Counter(store.starts)
    assert max(per_turn.values()) <= PER_TURN, per_turn
    await asyncio.gather(*runs)
    for n in range(streams):
        assert len(await store.read_events("tenant", f"key-{n}")) == 3
