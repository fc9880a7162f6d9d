"""LiveStream: followers at their own pace, memory trimmed, the backlog read from the store."""

from __future__ import annotations

import asyncio

import pytest

from payonce.gateway.live import LiveStream


async def collect(live: LiveStream, after: int = 0) -> list[bytes]:
    return [event async for _, batch in live.follow(after) for event in batch]


async def test_followers_early_and_late_get_the_same_events_while_memory_is_trimmed() -> None:
    recorded: list[bytes] = []

    async def backlog(after: int, upto: int) -> list[bytes]:
        return recorded[after:upto]

    live = LiveStream(200, (), backlog)
    early = asyncio.create_task(collect(live))
    for number in range(1, 101):
        event = b"data: %d\n\n" % number
        live.append([event])
        recorded.append(event)
        await asyncio.sleep(0)
        if number % 10 == 0:
            live.trim(len(recorded))
    assert live.base > 0, "recorded events have left memory"
    late = asyncio.create_task(collect(live))
    resumed = asyncio.create_task(collect(live, after=40))
    await asyncio.sleep(0)
    live.finish()
    assert await early == recorded
    assert await late == recorded, "a late follower reads the trimmed part back"
    assert await resumed == recorded[40:]


async def test_a_slow_follower_holds_the_window_open() -> None:
    live = LiveStream(200, (), backlog=None)
    live.append([b"a", b"b"])
    live.trim(2)
    assert live.base == 0, "without a store to read back from, nothing is dropped"


async def test_a_failed_stream_raises_after_its_last_events() -> None:
    live = LiveStream(200, ())
    live.append([b"x"])
    live.finish(failed=True)
    seen: list[bytes] = []

    async def drain() -> None:
        async for _, batch in live.follow():
            seen.extend(batch)

    with pytest.raises(ConnectionError):
        await drain()
    assert seen == [b"x"]


async def test_a_caught_up_follower_takes_events_by_push_and_falls_back_when_it_cannot() -> None:
    """Pushed events are numbered as yielded ones would be; a push refused (a slow
    client) hands the same events, and those after, to the follower's own task."""
    live = LiveStream(200, ())
    pushed: list[tuple[int, list[bytes]]] = []
    takes = True

    def push(events: list[bytes], before: int) -> bool:
        if takes:
            pushed.append((before, list(events)))
        return takes

    yielded: list[tuple[int, list[bytes]]] = []

    async def follow() -> None:
        async for before, batch in live.follow(0, push):
            yielded.append((before, list(batch)))

    follower = asyncio.create_task(follow())
    live.append([b"a"])  # before the follower caught up: yielded
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    live.append([b"b", b"c"])
    live.append([b"d"])
    takes = False
    live.append([b"e"])  # refused: the follower's task sends it
    live.append([b"f"])
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    takes = True
    live.append([b"g"])
    await asyncio.sleep(0)
    live.finish()
    await follower
    assert pushed[:2] == [(1, [b"b", b"c"]), (3, [b"d"])]
    assert yielded[0] == (0, [b"a"])
    assert (4, [b"e", b"f"]) in yielded
    every = sorted(pushed + yielded)
    numbered = [(before + n, event) for before, batch in every for n, event in enumerate(batch, 1)]
    assert numbered == list(enumerate([b"a", b"b", b"c", b"d", b"e", b"f", b"g"], 1))
    assert live.followers == 0


async def test_a_push_that_raises_never_reaches_the_run() -> None:
    live = LiveStream(200, ())

    def push(events: list[bytes], before: int) -> bool:
        raise OSError("the client's socket broke")

    got: list[bytes] = []

    async def follow() -> None:
        async for _, batch in live.follow(0, push):
            got.extend(batch)

    follower = asyncio.create_task(follow())
    await asyncio.sleep(0)
    live.append([b"x"])  # the run's own call: must not raise
    live.finish()
    await follower
    assert got == [b"x"]
