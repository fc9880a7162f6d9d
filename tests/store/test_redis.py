"""Redis specifics: URLs, outages and reconnects, slots, real expiry, wake-ups, script cache."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from payonce.clock import ManualClock, SystemClock
from payonce.errors import ConfigError, StorageError, StorageTimeout
from payonce.store import (
    Appended,
    ClaimStatus,
    Record,
    RecordState,
    StoredResponse,
    open_store,
    validate_store_url,
)
from payonce.store.redis import RedisStore, parse_redis_url
from tests.support.redis import RedisCluster, RedisServer, command, running_redis

RESPONSE = StoredResponse(200, (("content-type", "application/json"),), b'{"ok":1}')


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A server of this test's own, free to be stopped and started again."""
    with running_redis(tmp_path) as server:
        yield server


@pytest.fixture
async def redis_store(redis_server: RedisServer) -> AsyncIterator[RedisStore]:
    redis_server.flush()
    store = RedisStore(redis_server.url, ManualClock())
    yield store
    await store.close()


# --- URLs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "cluster", "timeout", "prefix"),
    [
        ("redis://127.0.0.1:6379/0", False, 5.0, "payonce"),
        ("redis://:secret@cache.internal/3?timeout=0.5", False, 0.5, "payonce"),
        ("rediss://user:pw@cache.internal:6380?prefix=po&ssl_ca_certs=/ca.pem", False, 5.0, "po"),
        ("redis+cluster://10.0.0.1:7000", True, 5.0, "payonce"),
        ("rediss+cluster://10.0.0.1:7000/0?timeout=2", True, 2.0, "payonce"),
    ],
)
def test_redis_urls_are_accepted(url: str, cluster: bool, timeout: float, prefix: str) -> None:
    assert validate_store_url(url) == url
    parsed = parse_redis_url(url)
    assert (parsed.cluster, parsed.timeout, parsed.prefix) == (cluster, timeout, prefix)
    assert parsed.url.startswith(("redis://", "rediss://"))
    assert "timeout" not in parsed.url and "prefix" not in parsed.url


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://", "no host"),
        ("redis://h:notaport", "bad port"),
        ("redis://h/db1", "must be a number"),
        ("redis+cluster://h:7000/2", "only database 0"),
        ("redis://h?timeout=soon", "not a number"),
        ("redis://h?timeout=0", "above 0"),
        ("redis://h?prefix=a:b", "prefix"),
        ("redis://h?prefix={x}", "prefix"),
        ("redis://h?ssl_ca_certs=/ca.pem", "unknown Redis option"),
        ("redis://h?db=1", "unknown Redis option 'db'"),
    ],
)
def test_bad_redis_urls_are_config_errors(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate_store_url(url)


async def test_open_store_opens_redis_without_connecting() -> None:
    store = open_store("redis://127.0.0.1:1/0")  # nothing listens on port 1
    assert isinstance(store, RedisStore)
    with pytest.raises(StorageError):
        await store.ping()
    await store.close()


# --- keys and slots -----------------------------------------------------------------------


def test_tenants_with_separators_never_share_a_key() -> None:
    store = RedisStore("redis://127.0.0.1:1/0")
    assert store.keys("a:b", "c").record != store.keys("a", "b:c").record
    assert store.keys("t", "k").record == b"payonce:{t:k}:r"
    assert store.keys("{x}", "k").record == b"payonce:{%7Bx%7D:k}:r"


async def test_every_key_of_a_record_lives_on_one_cluster_slot(
    redis_cluster: RedisCluster,
) -> None:
    redis_cluster.flush()
    store = RedisStore(redis_cluster.url, ManualClock())
    port = redis_cluster.nodes[0].port
    slots = set()
    for tenant, key in [("t", "k"), ("0f3a", "order-42"), ("a:b", "x}y"), ("t", "{odd}")]:
        claim = await store.claim(tenant, key, "fp", lease=30, ttl=60)
        token = claim.record.token
        assert await store.begin_stream(tenant, key, token, 200, ())
        assert await store.append_events(tenant, key, token, 1, [b"data: 1\n\n"])
        names = store.keys(tenant, key)
        slot = {
            command(port, "CLUSTER", "KEYSLOT", name.decode())
            for name in (names.record, names.events, names.channel)
        }
        assert len(slot) == 1, (tenant, key, slot)
        slots |= slot
        assert await store.read_events(tenant, key) == [b"data: 1\n\n"]
    assert len(slots) > 1, "different records spread over the cluster"
    await store.close()


# --- time ---------------------------------------------------------------------------------


async def test_keys_expire_in_redis_after_the_ttl(redis_server: RedisServer) -> None:
    # The one test on real time: Redis must delete what the gateway's clock forgot.
    redis_server.flush()
    store = RedisStore(redis_server.url, SystemClock(), expiry_margin=0.2)
    claim = await store.claim("t", "k", "fp", lease=30, ttl=0.5)
    token = claim.record.token
    await store.begin_stream("t", "k", token, 200, ())
    await store.append_events("t", "k", token, 1, [b"e1", b"e2"])
    await store.complete("t", "k", token, StoredResponse(200, (), b"", stream=True), ttl=0.5)
    names = store.keys("t", "k")
    exists = ("EXISTS", names.record.decode(), names.events.decode())
    assert command(redis_server.port, *exists).strip() == ":2"
    started = time.monotonic()
    while command(redis_server.port, *exists).strip() != ":0":
        assert time.monotonic() - started < 2.0, "keys still there 2 s later"
        await asyncio.sleep(0.05)
    assert time.monotonic() - started >= 0.5
    assert await store.purge_expired() == 0
    await store.close()


async def test_leases_and_ttl_follow_the_injected_clock_not_the_servers(
    redis_server: RedisServer,
) -> None:
    redis_server.flush()
    clock = ManualClock(start=10_000.0)  # 1970: by the server's clock all of it expired long ago
    store = RedisStore(redis_server.url, clock)
    first = await store.claim("t", "k", "fp", lease=30, ttl=3600)
    assert (await store.claim("t", "k", "fp", lease=30, ttl=3600)).status is ClaimStatus.IN_PROGRESS
    clock.advance(31)
    second = await store.claim("t", "k", "fp", lease=30, ttl=3600)
    assert second.status is ClaimStatus.ACQUIRED and second.record.created_at == 10_031.0
    assert not await store.complete("t", "k", first.record.token, RESPONSE, ttl=3600)
    assert await store.complete("t", "k", second.record.token, RESPONSE, ttl=3600)
    ttl_ms = int(command(redis_server.port, "PTTL", store.keys("t", "k").record.decode())[1:])
    assert 3600_000 < ttl_ms <= 3660_000, "Redis keeps the keys ttl + margin from the answer"
    clock.advance(3600)
    assert await store.get("t", "k") is None, "past its ttl by the gateway's clock"
    await store.close()


async def test_a_renewal_pushes_redis_own_expiry_past_the_lease(
    redis_server: RedisServer,
) -> None:
    # Redis deletes a record by its PEXPIRE whatever the gateway's clock says: a
    # running call's keys must outlive its lease there too, and a completed
    # answer's must live ttl (plus the margin) from its completion.
    redis_server.flush()
    clock = ManualClock()
    store = RedisStore(redis_server.url, clock, expiry_margin=1)
    claim = await store.claim("t", "k", "fp", lease=30, ttl=0.5)
    token = claim.record.token
    assert await store.begin_stream("t", "k", token, 200, ())
    assert await store.append_events("t", "k", token, 1, [b"e1"])
    names = store.keys("t", "k")

    def pttl(name: bytes) -> int:
        return int(command(redis_server.port, "PTTL", name.decode())[1:])

    assert pttl(names.record) > 60_000, "a claim's keys live past its lease plus a lease"
    for name in (names.record, names.events):  # as a claim of an earlier version left them
        command(redis_server.port, "PEXPIRE", name.decode(), "2000")
    clock.advance(10)
    assert await store.renew("t", "k", token, lease=30)
    assert pttl(names.record) > 60_000 and pttl(names.events) > 60_000
    assert await store.complete("t", "k", token, StoredResponse(200, (), b"", stream=True), ttl=5)
    assert 5_000 < pttl(names.record) <= 6_000 and 5_000 < pttl(names.events) <= 6_000
    await store.close()


# --- outages ------------------------------------------------------------------------------


async def test_an_outage_fails_fast_and_a_restart_needs_no_gateway_restart(
    own_server: RedisServer,
) -> None:
    clock = ManualClock()
    store = RedisStore(own_server.url + "?timeout=1", clock, poll_interval=30)
    claim = await store.claim("t", "before", "fp", lease=30, ttl=60)
    token = claim.record.token
    # A waiter subscribed before the outage, on a lease that will not lapse by itself.
    waiter = asyncio.create_task(store.wait("t", "before", timeout=20))
    await asyncio.sleep(0.1)
    own_server.stop()
    started = time.monotonic()
    operations = [
        store.claim("t", "k", "fp", lease=30, ttl=60),
        store.renew("t", "before", token, lease=30),
        store.complete("t", "before", token, RESPONSE, ttl=60),
        store.release("t", "before", token),
        store.begin_stream("t", "before", token, 200, ()),
        store.append_events("t", "before", token, 1, [b"x"]),
        store.read_events("t", "before"),
        store.add_replays({("t", "before"): 1}),
        store.get("t", "before"),
        store.wait("t", "other", timeout=5),
        store.ping(),
    ]
    for operation in operations:
        with pytest.raises(StorageError):
            await operation
    assert time.monotonic() - started < 2, "connection refused is reported at once"
    own_server.start()
    # The server kept nothing (no persistence): the old record is gone, and the
    # waiter that subscribed before the outage is woken by the reconnect.
    assert await asyncio.wait_for(waiter, 5) is None
    again = await store.claim("t", "before", "fp", lease=30, ttl=60)
    assert again.status is ClaimStatus.ACQUIRED
    late = asyncio.create_task(store.wait("t", "before", timeout=20))
    await asyncio.sleep(0.1)
    assert await store.complete("t", "before", again.record.token, RESPONSE, ttl=60)
    record = await asyncio.wait_for(late, 5)
    assert record is not None and record.state is RecordState.COMPLETED
    await store.ping()
    await store.close()


async def test_a_slow_server_is_a_store_timeout(redis_server: RedisServer) -> None:
    redis_server.flush()
    store = RedisStore(redis_server.url + "?timeout=0.2", ManualClock())
    await store.ping()
    assert command(redis_server.port, "CLIENT", "PAUSE", "1000", "WRITE").startswith("+OK")
    try:
        with pytest.raises(StorageTimeout):
            await store.claim("t", "k", "fp", lease=30, ttl=60)
    finally:
        command(redis_server.port, "CLIENT", "UNPAUSE")
    await store.close()


async def test_replay_counts_that_timed_out_are_counted_once_when_sent_again(
    redis_server: RedisServer,
) -> None:
    # A write that times out may still run once the server answers again: the
    # gateway, keeping its counts for the next flush, counted those replays twice
    # (found by payonce torture: a status with 2 replays, one in the call logs).
    redis_server.flush()
    store = RedisStore(redis_server.url + "?timeout=0.2", ManualClock())
    claim = await store.claim("t", "k", "fp", lease=30, ttl=60)
    assert await store.complete("t", "k", claim.record.token, RESPONSE, ttl=60)
    assert command(redis_server.port, "CLIENT", "PAUSE", "600", "WRITE").startswith("+OK")
    with pytest.raises(StorageTimeout):
        await store.add_replays({("t", "k"): 3}, batch="b1")
    await asyncio.sleep(0.8)  # the pause ends; the server runs what it held
    await store.add_replays({("t", "k"): 3}, batch="b1")  # the caller tries again
    await store.add_replays({("t", "k"): 1}, batch="b2")
    record = await store.get("t", "k")
    assert record is not None and record.replays == 4
    await store.close()


async def test_scripts_are_loaded_again_after_the_server_forgets_them(
    redis_store: RedisStore, redis_server: RedisServer
) -> None:
    claim = await redis_store.claim("t", "k", "fp", lease=30, ttl=60)
    assert await redis_store.complete("t", "k", claim.record.token, RESPONSE, ttl=60)
    assert command(redis_server.port, "SCRIPT", "FLUSH").startswith("+OK")
    assert (
        await redis_store.claim("t", "k", "fp", lease=30, ttl=60)
    ).status is ClaimStatus.COMPLETED
    assert command(redis_server.port, "SCRIPT", "FLUSH").startswith("+OK")
    await redis_store.add_replays({("t", "k"): 2})
    record = await redis_store.get("t", "k")
    assert record is not None and record.replays == 2


# --- wake-ups and streams -----------------------------------------------------------------


async def test_waiters_are_woken_by_pubsub_not_by_polling(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Polls a minute apart and waits of 20 s: a waiter back within 10 s was woken by a
    # message, however slow the machine (not "within 0.5 s", which a busy one can miss).
    redis_server.flush()
    store = RedisStore(redis_server.url, ManualClock(), poll_interval=60)
    reads = 0
    get = store.get

    async def counted(tenant: str, key: str) -> Record | None:
        nonlocal reads
        reads += 1
        return await get(tenant, key)

    monkeypatch.setattr(store, "get", counted)
    try:
        claim = await store.claim("t", "k", "fp", lease=30, ttl=60)
        token = claim.record.token
        await store.begin_stream("t", "k", token, 200, ())
        reads = 0
        waiters = [asyncio.create_task(store.wait("t", "k", timeout=20)) for _ in range(5)]
        # Each has subscribed, then read the record: what it waits to see change.
        await _until(lambda: reads >= 5, "the waiters' first reads")
        assert await store.append_events("t", "k", token, 1, [b"e1"])
        for record in await asyncio.wait_for(asyncio.gather(*waiters), 10):
            assert record is not None and record.events == 1
        reads = 0
        waiter = asyncio.create_task(store.wait("t", "k", timeout=20))
        await _until(lambda: reads >= 1, "the waiter's first read")
        assert await store.complete(
            "t", "k", token, StoredResponse(200, (), b"", stream=True), ttl=60
        )
        record = await asyncio.wait_for(waiter, 10)
        assert record is not None and record.state is RecordState.COMPLETED
    finally:
        await store.close()


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, f"not within 10 s: {what}"
        await asyncio.sleep(0.01)


async def test_a_batch_of_thousands_of_events_is_one_append(redis_store: RedisStore) -> None:
    claim = await redis_store.claim("t", "k", "fp", lease=30, ttl=60)
    token = claim.record.token
    await redis_store.begin_stream("t", "k", token, 200, ())
    events = [f"data: {i}\n\n".encode() for i in range(2500)]
    assert await redis_store.append_events("t", "k", token, 1, events)
    assert await redis_store.append_events("t", "k", token, 2501, [b"last"])
    assert await redis_store.read_events("t", "k", after=2499) == [events[-1], b"last"]
    record = await redis_store.get("t", "k")
    assert record is not None and record.events == 2501


def _reads(port: int) -> int:
    """Reads of client sockets Redis has processed (``INFO stats``), this one's included."""
    info = command(port, "INFO", "stats")
    return int(re.search(r"total_reads_processed:(\d+)", info).group(1))  # type: ignore[union-attr]


async def test_appends_in_separate_turns_go_to_redis_together(
    redis_server: RedisServer, redis_store: RedisStore
) -> None:
    # Stream events arrive one or two a loop turn: an append waits DEFER for the
    # others instead of being a pipeline (a send, a read in Redis) of its own.
    claims = [await redis_store.claim("t", f"k{i}", "fp", lease=30, ttl=60) for i in range(20)]
    for i, claim in enumerate(claims):
        assert await redis_store.begin_stream("t", f"k{i}", claim.record.token, 200, ())
    # The first run of a script on a server is an EVAL of its own (NOSCRIPT): not here.
    assert not await redis_store.append_events("t", "absent", "token", 1, [b"x"])
    before = _reads(redis_server.port)
    appends = []
    for i, claim in enumerate(claims):
        appends.append(
            asyncio.create_task(
                redis_store.append_events("t", f"k{i}", claim.record.token, 1, [f"e{i}".encode()])
            )
        )
        for _ in range(3):  # turns of the loop between one append and the next
            await asyncio.sleep(0)
    assert await asyncio.gather(*appends) == [True] * 20
    # Two INFO commands, and the appends: one pipeline (two if a timer split them).
    assert _reads(redis_server.port) - before <= 4
    for i in range(20):
        assert await redis_store.read_events("t", f"k{i}") == [f"e{i}".encode()]
    stale = await redis_store.append_events("t", "k0", "stale-token", 2, [b"x"])
    assert stale is Appended.LOST  # a deferred append still checks the token


async def test_a_claim_run_twice_after_a_lost_reply_is_still_acquired(
    redis_store: RedisStore,
) -> None:
    # redis-py re-sends a command once when its connection breaks; the claim
    # may then run twice with the same token. The second run must not report
    # the caller's own claim as somebody else's run in progress.
    from payonce.store.redis import scripts

    keys = redis_store.keys("t", "k")
    now = redis_store._clock.now()
    args = ("fp", "0123456789abcdef", repr(now), repr(now + 30), repr(now + 3600), 3_660_000)
    assert await redis_store._run(scripts.CLAIM, keys, *args) == [b"acquired"]
    assert await redis_store._run(scripts.CLAIM, keys, *args) == [b"acquired"]
    other = await redis_store.claim("t", "k", "fp", lease=30, ttl=3600)
    assert other.status is ClaimStatus.IN_PROGRESS
    assert other.record.token == "0123456789abcdef"


@pytest.mark.parametrize("auto_pipeline", [True, False])
async def test_bursts_of_mixed_commands_keep_their_own_results(
    redis_server: RedisServer, auto_pipeline: bool
) -> None:
    # With auto-pipelining one turn's commands share a pipeline; each must
    # still get its own answer, and a lost script (NOSCRIPT) costs nothing.
    redis_server.flush()
    store = RedisStore(redis_server.url, ManualClock(), auto_pipeline=auto_pipeline)
    claims = await asyncio.gather(
        *(store.claim("t", f"k{i}", "fp", lease=30, ttl=60) for i in range(20))
    )
    assert all(c.status is ClaimStatus.ACQUIRED for c in claims)
    assert command(redis_server.port, "SCRIPT", "FLUSH").startswith("+OK")
    results = await asyncio.gather(
        *(
            store.complete(
                "t", f"k{i}", c.record.token, StoredResponse(200, (), str(i).encode()), ttl=60
            )
            for i, c in enumerate(claims[:10])
        ),
        *(store.release("t", f"k{i}", "stale-token") for i in range(10, 20)),
        *(store.get("t", f"k{i}") for i in range(20)),
        store.get("t", "absent"),
    )
    assert results[:10] == [True] * 10
    assert results[10:20] == [False] * 10
    records = results[20:40]
    assert [r is not None and r.key for r in records] == [f"k{i}" for i in range(20)]
    assert results[40] is None
    done = await asyncio.gather(*(store.get("t", f"k{i}") for i in range(10)))
    assert [r.response.body if r and r.response else None for r in done] == [
        str(i).encode() for i in range(10)
    ]
    await store.close()


async def test_a_cancelled_first_command_does_not_strand_the_rest_of_its_batch(
    redis_store: RedisStore,
) -> None:
    claim = await redis_store.claim("t", "k", "fp", lease=30, ttl=60)
    tasks = [asyncio.create_task(redis_store.get("t", "k")) for _ in range(5)]
    await asyncio.sleep(0)  # the first leads and yields; the others join its batch
    tasks[0].cancel()
    records = await asyncio.wait_for(asyncio.gather(*tasks[1:]), 5)
    assert all(r is not None and r.token == claim.record.token for r in records)
    assert tasks[0].cancelled()
