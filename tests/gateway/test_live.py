"""LiveStream: followers at their own pace, memory trimmed, the backlog read from the store."""

from __future__ import annotations

import asyncio

import pytest

from payonce.gateway.live import LiveStream


async def collect(live: LiveStream, after: int = 0) -> list[bytes]:
    return [event async for batch in live.follow(after) for event in batch]


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
        async for batch in live.follow():
            seen.extend(batch)

    with pytest.raises(ConnectionError):
        await drain()
    assert seen == [b"x"]
