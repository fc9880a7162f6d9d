"""A stream's writer learns from its writes whether a follower elsewhere reads them.

Two stores on one backend stand for two processes (two workers, two replicas):
the owner appends, the follower waits on the record as a gateway relaying a
stream another process records does. Until the follower comes, appends answer
``WRITTEN`` and the gateway writes the stream now and then; once it waits,
``WATCHED`` (Redis, PostgreSQL; SQLite's writers learn it from ``watched_runs``
alone), and the gateway writes every 50 ms (gateway/recording.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from payonce.clock import ManualClock
from payonce.store import Appended, MemoryStore, SQLiteStore, Store
from payonce.store.postgres import PostgresStore
from payonce.store.redis import RedisStore
from tests.store.conftest import empty_postgres
from tests.support.following import following, running_stream
from tests.support.postgres import Postgres
from tests.support.redis import RedisCluster, RedisServer

Pair = tuple[Store, Store]


@pytest.fixture(params=("sqlite", "redis", "redis-cluster", "postgres"))
async def pair(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[Pair]:
    """Two stores on one backend: the owner's process and a follower's."""
    make: Callable[[], Store]
    if request.param == "sqlite":
        path = str(tmp_path / "shared.db")

        def make() -> Store:
            return SQLiteStore(path, clock, poll_interval=0.02)

    elif request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        server.flush()

        def make() -> Store:
            return RedisStore(server.url, clock)

    elif request.param == "redis-cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        cluster.flush()

        def make() -> Store:
            return RedisStore(cluster.url, clock)

    else:
        pg: Postgres = request.getfixturevalue("postgres_server")
        empty_postgres(pg)

        def make() -> Store:
            return PostgresStore(pg.url, clock, poll_interval=0.02)

    owner, follower = make(), make()
    yield owner, follower
    await owner.close()
    await follower.close()


async def _appended_until_watched(store: Store, token: str, first: int) -> Appended:
    # The follower's mark (or subscription) lands a moment after its wait began:
    # append, as the writer would, until an append says so (or give up after 10 s).
    appended = Appended.LOST
    for number in range(first, first + 200):
        appended = await store.append_events("t", "k", token, number, [b"data: %d\n\n" % number])
        if appended is Appended.WATCHED:
            break
        await asyncio.sleep(0.05)
    return appended


async def _known_watched(store: Store, token: str, first: int) -> bool:
    # As the writer learns it: from an append, or from the probe's watched_runs
    # (SQLite's appends never say it).
    for number in range(first, first + 200):
        appended = await store.append_events("t", "k", token, number, [b"data: %d\n\n" % number])
        if appended is Appended.WATCHED or await store.watched_runs([("t", "k")]):
            return True
        await asyncio.sleep(0.05)
    return False


@pytest.mark.parametrize("pair", ["redis", "redis-cluster", "postgres"], indirect=True)
async def test_appends_say_watched_once_a_follower_elsewhere_waits(pair: Pair) -> None:
    owner, follower = pair
    token = await running_stream(owner)
    assert await owner.append_events("t", "k", token, 1, [b"data: 1\n\n"]) is Appended.WRITTEN
    async with following(follower):
        assert await _appended_until_watched(owner, token, 2) is Appended.WATCHED
    # What the follower waits for is all there, in order, whatever the cadence.
    events = await follower.read_events("t", "k")
    assert events == [b"data: %d\n\n" % n for n in range(1, len(events) + 1)]


@pytest.mark.parametrize("pair", ["sqlite"], indirect=True)
async def test_sqlite_appends_leave_the_watched_mark_to_watched_runs(pair: Pair) -> None:
    # An append that read the mark back would cost a read per write; the
    # writer's probe asks watched_runs every 250 ms instead (gateway/watch_probe.py).
    owner, follower = pair
    token = await running_stream(owner)
    async with following(follower):
        assert await _known_watched(owner, token, 1)
        assert await owner.watched_runs([("t", "k")]) == {("t", "k")}
        appended = await owner.append_events("t", "k", token, 900, [b"data: 900\n\n"])
        assert appended is Appended.WRITTEN
    events = await follower.read_events("t", "k")
    assert events[-1] == b"data: 900\n\n"


async def test_a_lost_key_is_still_lost_for_a_watched_stream(pair: Pair) -> None:
    owner, follower = pair
    token = await running_stream(owner)
    async with following(follower):
        assert await _known_watched(owner, token, 1)
    assert await owner.release("t", "k", token)
    lost = await owner.append_events("t", "k", token, 9, [b"data: late\n\n"])
    assert lost is Appended.LOST and not lost


# Redis has no mark to clear: it counts the receivers of each notification.
@pytest.mark.parametrize("pair", ["sqlite", "postgres"], indirect=True)
async def test_a_new_run_of_the_key_starts_unwatched(pair: Pair) -> None:
    owner, follower = pair
    token = await running_stream(owner)
    async with following(follower):
        assert await _known_watched(owner, token, 1)
    assert await owner.release("t", "k", token)
    again = await running_stream(owner)
    assert await owner.append_events("t", "k", again, 1, [b"data: 1\n\n"]) is Appended.WRITTEN
    assert await owner.watched_runs([("t", "k")]) == set()


async def test_a_store_in_one_process_never_says_watched(clock: ManualClock) -> None:
    store = MemoryStore(clock)
    token = await running_stream(store)
    waiting = asyncio.create_task(store.wait("t", "k", 30))
    await asyncio.sleep(0)
    assert await store.append_events("t", "k", token, 1, [b"data: 1\n\n"]) is Appended.WRITTEN
    await waiting


async def test_a_follower_elsewhere_is_found_without_a_write(pair: Pair) -> None:
    # The writer of a quiet stream asks now and then, for all its streams at
    # once, rather than waiting for its next write (up to a second away).
    owner, follower = pair
    token = await running_stream(owner)
    await running_stream(owner, "other")
    assert await owner.append_events("t", "k", token, 1, [b"data: 1\n\n"]) is Appended.WRITTEN
    runs = [("t", "k"), ("t", "other"), ("u", "k"), ("t", "gone")]
    assert await owner.watched_runs(runs) == set()
    found: set[tuple[str, str]] = set()
    async with following(follower):
        for _ in range(200):
            found = await owner.watched_runs(runs)
            if found:
                break
            await asyncio.sleep(0.05)
    assert found == {("t", "k")}
    assert await owner.watched_runs([]) == set()


async def test_many_runs_are_asked_at_once(pair: Pair) -> None:
    owner, _ = pair
    runs = [("t", f"key-{n}") for n in range(1200)] + [("u", "k")]
    assert await owner.watched_runs(runs) == set()


async def test_a_store_in_one_process_finds_no_follower_elsewhere(clock: ManualClock) -> None:
    store = MemoryStore(clock)
    await running_stream(store)
    assert await store.watched_runs([("t", "k")]) == set()
