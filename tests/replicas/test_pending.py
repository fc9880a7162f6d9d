"""Writes that failed during a store outage are retried, in order, and stay fenced."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from payonce.clock import ManualClock
from payonce.errors import StorageError
from payonce.gateway.pending import PendingWrites
from payonce.store import ClaimStatus, MemoryStore, RecordState, StoredResponse

ANSWER = StoredResponse(200, (("content-type", "application/json"),), b'{"ok":true}')


class Outage:
    """Fails every write made through :meth:`guard` while ``down``, as a store outage does."""

    def __init__(self) -> None:
        self.down = True

    def guard(self, write: Callable[[], Awaitable[bool]]) -> Callable[[], Awaitable[bool]]:
        async def attempt() -> bool:
            if self.down:
                raise StorageError("the store is down")
            return await write()

        return attempt


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


async def test_a_complete_that_failed_is_written_when_the_store_is_back(clock: ManualClock) -> None:
    outage, store = Outage(), MemoryStore(clock)
    claim = await store.claim("t", "k", "fp", lease=30, ttl=3600)
    pending = PendingWrites(clock)
    token = claim.record.token
    write = outage.guard(lambda: store.complete("t", "k", token, ANSWER, ttl=3600))
    pending.add("complete", "k", write, clock.now() + 3600)
    assert await pending.retry() == 0 and len(pending) == 1
    outage.down = False
    assert await pending.retry() == 1 and len(pending) == 0
    again = await store.claim("t", "k", "fp", lease=30, ttl=3600)
    assert again.status is ClaimStatus.COMPLETED
    assert again.record.response == ANSWER


async def test_a_late_write_is_refused_once_another_holder_took_the_key_over(
    clock: ManualClock,
) -> None:
    outage, store = Outage(), MemoryStore(clock)
    first = (await store.claim("t", "k", "fp", lease=1, ttl=3600)).record.token
    pending = PendingWrites(clock)
    write = outage.guard(lambda: store.complete("t", "k", first, ANSWER, ttl=3600))
    pending.add("complete", "k", write, clock.now() + 3600)
    clock.advance(2)  # the lease lapses during the outage; another gateway takes over
    takeover = await store.claim("t", "k", "fp", lease=30, ttl=3600)
    assert takeover.status is ClaimStatus.ACQUIRED
    outage.down = False
    assert await pending.retry() == 1  # made, and refused by fencing
    record = await store.get("t", "k")
    assert record is not None
    assert record.state is RecordState.IN_PROGRESS and record.token == takeover.record.token


async def test_a_failed_release_is_retried_and_frees_the_key(clock: ManualClock) -> None:
    outage, store = Outage(), MemoryStore(clock)
    token = (await store.claim("t", "k", "fp", lease=30, ttl=3600)).record.token
    pending = PendingWrites(clock)
    write = outage.guard(lambda: store.release("t", "k", token))
    pending.add("release", "k", write, clock.now() + 3600)
    outage.down = False
    await pending.retry()
    assert (await store.claim("t", "k", "fp", lease=30, ttl=3600)).status is ClaimStatus.ACQUIRED


async def test_writes_past_their_record_expiry_and_over_the_limit_are_dropped(
    clock: ManualClock,
) -> None:
    calls: list[str] = []

    def write(name: str) -> Callable[[], Awaitable[bool]]:
        async def attempt() -> bool:
            calls.append(name)
            return True

        return attempt

    pending = PendingWrites(clock, limit=2)
    pending.add("release", "a", write("a"), clock.now() + 10)
    pending.add("release", "b", write("b"), clock.now() + 1)
    pending.add("release", "c", write("c"), clock.now() + 10)
    assert len(pending) == 2  # "a", the oldest, made room for "c"
    clock.advance(5)  # "b"'s record has expired: writing it would be pointless
    assert await pending.retry() == 1
    assert calls == ["c"]
