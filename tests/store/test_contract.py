"""What every store must do. Leases and TTLs are driven by a manual clock, never by sleeping."""

from __future__ import annotations

import asyncio

from payonce.clock import ManualClock
from payonce.store import ClaimStatus, RecordState, Store, StoredResponse
from payonce.store.redis import RedisStore

LEASE, TTL = 30.0, 3600.0
RESPONSE = StoredResponse(
    200, (("content-type", "application/json"), ("x-request-id", "r1")), b'{"ok":1}'
)


async def claim(store: Store, key: str = "k", fp: str = "fp") -> tuple[ClaimStatus, str]:
    result = await store.claim("t", key, fp, lease=LEASE, ttl=TTL)
    return result.status, result.record.token


async def test_first_claim_acquires_and_second_sees_in_progress(store: Store) -> None:
    status, token = await claim(store)
    assert status is ClaimStatus.ACQUIRED
    again = await store.claim("t", "k", "fp", lease=LEASE, ttl=TTL)
    assert again.status is ClaimStatus.IN_PROGRESS
    assert again.record.token == token


async def test_complete_then_replays_are_counted_in_batches(store: Store) -> None:
    _, token = await claim(store)
    assert await store.complete(
        "t", "k", token, RESPONSE, usage={"input_tokens": 3}, cost_usd=0.5, ttl=TTL
    )
    for _ in range(2):
        result = await store.claim("t", "k", "fp", lease=LEASE, ttl=TTL)
        assert result.status is ClaimStatus.COMPLETED
        assert result.record.response == RESPONSE
    await store.add_replays({("t", "k"): 2, ("t", "gone"): 5})
    await store.add_replays({("t", "k"): 1})
    await store.add_replays({})
    assert await store.get("t", "gone") is None
    replayed = await store.get("t", "k")
    assert replayed is not None and replayed.replays == 3
    record = await store.get("t", "k")
    assert record is not None
    assert record.state is RecordState.COMPLETED
    assert record.usage == {"input_tokens": 3}
    assert record.cost_usd == 0.5


async def test_complete_adds_joined_duplicates_to_replays(store: Store) -> None:
    _, token = await claim(store)
    assert await store.complete("t", "k", token, RESPONSE, replays=4, ttl=TTL)
    record = await store.get("t", "k")
    assert record is not None and record.replays == 4


async def test_different_fingerprint_is_a_mismatch_and_leaves_the_record(store: Store) -> None:
    _, token = await claim(store)
    assert (await claim(store, fp="other"))[0] is ClaimStatus.MISMATCH
    await store.complete("t", "k", token, RESPONSE, ttl=TTL)
    assert (await claim(store, fp="other"))[0] is ClaimStatus.MISMATCH
    record = await store.get("t", "k")
    assert record is not None and record.fingerprint == "fp" and record.response == RESPONSE


async def test_tenants_and_keys_are_separate(store: Store) -> None:
    assert (await store.claim("a", "k", "fp", lease=LEASE, ttl=TTL)).status is ClaimStatus.ACQUIRED
    assert (await store.claim("b", "k", "fp", lease=LEASE, ttl=TTL)).status is ClaimStatus.ACQUIRED
    assert (await store.claim("a", "k2", "fp", lease=LEASE, ttl=TTL)).status is ClaimStatus.ACQUIRED
    assert await store.get("c", "k") is None


async def test_release_lets_the_next_claim_run_again(store: Store) -> None:
    _, token = await claim(store)
    assert await store.release("t", "k", token)
    assert await store.get("t", "k") is None
    status, new_token = await claim(store)
    assert status is ClaimStatus.ACQUIRED and new_token != token
    assert not await store.release("t", "k", token), "a stale token cannot release"


async def test_lease_expiry_lets_a_retry_take_over_and_fences_the_late_writer(
    store: Store, clock: ManualClock
) -> None:
    _, old = await claim(store)
    clock.advance(LEASE - 1)
    assert (await claim(store))[0] is ClaimStatus.IN_PROGRESS
    clock.advance(2)
    status, new = await claim(store)
    assert status is ClaimStatus.ACQUIRED and new != old
    late = StoredResponse(200, (), b"late")
    assert not await store.complete("t", "k", old, late, ttl=TTL)
    assert not await store.renew("t", "k", old, lease=LEASE)
    assert not await store.release("t", "k", old)
    assert await store.complete("t", "k", new, RESPONSE, ttl=TTL)
    record = await store.get("t", "k")
    assert record is not None and record.response == RESPONSE


async def test_expired_lease_with_another_fingerprint_is_still_a_mismatch(
    store: Store, clock: ManualClock
) -> None:
    await claim(store)
    clock.advance(LEASE + 1)
    assert (await claim(store, fp="other"))[0] is ClaimStatus.MISMATCH


async def test_renew_keeps_the_lease(store: Store, clock: ManualClock) -> None:
    _, token = await claim(store)
    for _ in range(5):
        clock.advance(LEASE - 5)
        assert await store.renew("t", "k", token, lease=LEASE)
    assert (await claim(store))[0] is ClaimStatus.IN_PROGRESS
    assert await store.complete("t", "k", token, RESPONSE, ttl=TTL)
    assert not await store.renew("t", "k", token, lease=LEASE), "completed records have no lease"


async def test_ttl_expiry_forgets_completed_records_and_purge_deletes_them(
    store: Store, clock: ManualClock
) -> None:
    _, token = await claim(store)
    await store.complete("t", "k", token, RESPONSE, ttl=TTL)
    await claim(store, key="young")
    clock.advance(TTL + 1)
    assert await store.get("t", "k") is None
    status, _ = await claim(store)
    assert status is ClaimStatus.ACQUIRED, "an expired record is a new key"
    clock.advance(TTL + 1)
    purged = await store.purge_expired()
    # Redis expires the keys itself (PEXPIRE at each claim): nothing to purge.
    assert purged >= 1 or (isinstance(store, RedisStore) and purged == 0)
    assert await store.get("t", "young") is None


async def test_wait_returns_when_the_holder_completes(store: Store) -> None:
    _, token = await claim(store)

    async def finish() -> None:
        await asyncio.sleep(0.05)
        await store.complete("t", "k", token, RESPONSE, ttl=TTL)

    task = asyncio.create_task(finish())
    record = await asyncio.wait_for(store.wait("t", "k", timeout=5), 3)
    await task
    assert record is not None and record.state is RecordState.COMPLETED


async def test_wait_returns_when_the_holder_releases(store: Store) -> None:
    _, token = await claim(store)

    async def give_up() -> None:
        await asyncio.sleep(0.05)
        await store.release("t", "k", token)

    task = asyncio.create_task(give_up())
    assert await asyncio.wait_for(store.wait("t", "k", timeout=5), 3) is None
    await task


async def test_wait_times_out_on_a_live_lease(store: Store) -> None:
    await claim(store)
    record = await store.wait("t", "k", timeout=0.05)
    assert record is not None and record.state is RecordState.IN_PROGRESS


async def test_wait_does_not_sleep_past_a_lapsed_lease(store: Store, clock: ManualClock) -> None:
    await claim(store)
    clock.advance(LEASE + 1)
    record = await asyncio.wait_for(store.wait("t", "k", timeout=30), 1)
    assert record is not None and record.lease_expires_at <= clock.now()


async def test_wait_returns_when_the_lease_lapses_not_before(
    store: Store, clock: ManualClock
) -> None:
    # A lapse is a change: nobody runs the key any more. The waiter learns it
    # when it happens (within the store's poll interval), neither before nor
    # only at its own timeout.
    await claim(store)
    waiting = asyncio.create_task(store.wait("t", "k", timeout=30))
    await asyncio.sleep(0.05)
    clock.advance(LEASE - 1)
    await asyncio.sleep(0.2)
    assert not waiting.done(), "returned with nothing new while the lease still ran"
    clock.advance(2)
    record = await asyncio.wait_for(waiting, 5)
    assert record is not None and record.state is RecordState.IN_PROGRESS
    assert record.lease_expires_at <= clock.now()


async def test_wait_keeps_waiting_through_a_renewal(store: Store, clock: ManualClock) -> None:
    _, token = await claim(store)
    waiting = asyncio.create_task(store.wait("t", "k", timeout=30))
    await asyncio.sleep(0.05)
    clock.advance(LEASE - 1)
    assert await store.renew("t", "k", token, lease=LEASE)
    clock.advance(2)  # past the first lease, within the renewed one
    await asyncio.sleep(0.2)
    assert not waiting.done(), "a renewed lease is not a change worth returning for"
    assert await store.complete("t", "k", token, RESPONSE, ttl=TTL)
    record = await asyncio.wait_for(waiting, 5)
    assert record is not None and record.state is RecordState.COMPLETED


async def test_wait_on_a_record_nobody_runs_returns_at_once(
    store: Store, clock: ManualClock
) -> None:
    # Completed, gone or abandoned: nothing changes it by itself, so nothing to wait for.
    _, token = await claim(store, key="done")
    await store.complete("t", "done", token, RESPONSE, ttl=TTL)
    await claim(store, key="abandoned")
    clock.advance(LEASE + 1)
    for key in ("done", "abandoned", "never"):
        await asyncio.wait_for(store.wait("t", key, timeout=30), 1)


async def test_a_record_whose_lease_lapsed_says_so(store: Store, clock: ManualClock) -> None:
    await claim(store)
    running = await store.get("t", "k")
    assert running is not None and not running.lease_lapsed(clock.now())
    clock.advance(LEASE)
    lapsed = await store.get("t", "k")
    assert lapsed is not None and lapsed.lease_lapsed(clock.now())
    status, new = await claim(store)
    assert status is ClaimStatus.ACQUIRED
    assert await store.complete("t", "k", new, RESPONSE, ttl=TTL)
    done = await store.get("t", "k")
    assert done is not None and not done.lease_lapsed(clock.now() + 2 * LEASE), "completed"


async def test_concurrent_claims_have_exactly_one_winner(store: Store) -> None:
    results = await asyncio.gather(
        *(store.claim("t", "k", "fp", lease=LEASE, ttl=TTL) for _ in range(50))
    )
    assert sum(r.status is ClaimStatus.ACQUIRED for r in results) == 1


async def test_responses_round_trip_bytes_and_header_order(store: Store) -> None:
    _, token = await claim(store)
    body = bytes(range(256)) * 10
    headers = (("x-b", "2"), ("x-a", "1"), ("set-cookie", "a=1"), ("set-cookie", "b=2"))
    await store.complete("t", "k", token, StoredResponse(201, headers, body), ttl=TTL)
    record = await store.get("t", "k")
    assert record is not None and record.response == StoredResponse(201, headers, body)


async def test_a_stream_is_recorded_event_by_event_and_completed(store: Store) -> None:
    _, token = await claim(store)
    headers = (("content-type", "text/event-stream"),)
    assert await store.begin_stream("t", "k", token, 200, headers)
    assert await store.append_events("t", "k", token, 1, [b"data: 1\n\n", b"data: 2\n\n"])
    assert await store.append_events("t", "k", token, 3, [b"data: 3\n\n"])
    running = await store.get("t", "k")
    assert running is not None and running.state is RecordState.IN_PROGRESS
    assert running.streaming and running.events == 3
    assert await store.read_events("t", "k") == [b"data: 1\n\n", b"data: 2\n\n", b"data: 3\n\n"]
    assert await store.read_events("t", "k", after=2) == [b"data: 3\n\n"]
    assert await store.complete(
        "t", "k", token, StoredResponse(200, headers, b"", stream=True), ttl=TTL
    )
    done = await store.get("t", "k")
    assert done is not None and done.state is RecordState.COMPLETED
    assert done.streaming and done.events == 3 and done.response is not None
    assert done.response.headers == headers
    assert len(await store.read_events("t", "k")) == 3
    # Its events' ids name the run by its token (gateway/sse.py, run_tag): kept.
    assert running.token == done.token == token
    replayed = await store.claim("t", "k", "fp", lease=LEASE, ttl=TTL)
    assert replayed.record.token == token


async def test_a_stale_holder_cannot_write_into_a_new_holders_stream(
    store: Store, clock: ManualClock
) -> None:
    _, old = await claim(store)
    assert await store.begin_stream("t", "k", old, 200, ())
    assert await store.append_events("t", "k", old, 1, [b"old 1", b"old 2"])
    clock.advance(LEASE + 1)
    status, new = await claim(store)
    assert status is ClaimStatus.ACQUIRED
    assert await store.begin_stream("t", "k", new, 200, ())
    assert await store.read_events("t", "k") == [], "the new holder starts with no events"
    assert not await store.append_events("t", "k", old, 3, [b"old 3"])
    assert not await store.begin_stream("t", "k", old, 200, ())
    assert await store.append_events("t", "k", new, 1, [b"new 1"])
    assert await store.read_events("t", "k") == [b"new 1"]


async def test_releasing_or_expiring_a_stream_drops_its_events(
    store: Store, clock: ManualClock
) -> None:
    _, token = await claim(store, key="released")
    await store.begin_stream("t", "released", token, 200, ())
    await store.append_events("t", "released", token, 1, [b"x"])
    assert await store.release("t", "released", token)
    assert await store.read_events("t", "released") == []
    _, token = await claim(store, key="expired")
    await store.begin_stream("t", "expired", token, 200, ())
    await store.append_events("t", "expired", token, 1, [b"y"])
    await store.complete("t", "expired", token, StoredResponse(200, (), b"", stream=True), ttl=TTL)
    clock.advance(TTL + 1)
    await store.purge_expired()
    assert await store.read_events("t", "expired") == []


async def test_wait_wakes_up_on_new_events(store: Store) -> None:
    _, token = await claim(store)
    await store.begin_stream("t", "k", token, 200, ())

    async def produce() -> None:
        await asyncio.sleep(0.05)
        await store.append_events("t", "k", token, 1, [b"e"])

    task = asyncio.create_task(produce())
    record = await asyncio.wait_for(store.wait("t", "k", timeout=5), 3)
    await task
    assert record is not None and record.events == 1


# --- expiry and leases (issue 29, defect 3) ------------------------------------------------


async def test_a_claims_expiry_is_never_inside_its_lease(store: Store, clock: ManualClock) -> None:
    # ttl shorter than the lease plus a lease: the expiry follows the lease.
    result = await store.claim("t", "k", "fp", lease=LEASE, ttl=LEASE)
    assert result.status is ClaimStatus.ACQUIRED
    for record in (result.record, await store.get("t", "k")):
        assert record is not None
        assert record.expires_at >= record.lease_expires_at + LEASE
        assert record.expires_at >= record.created_at + LEASE
    # A long ttl stays as it was: the expiry is the later of the two.
    long = await store.claim("t", "long", "fp", lease=LEASE, ttl=TTL)
    assert long.record.expires_at == clock.now() + TTL


async def test_a_call_renewed_past_its_ttl_keeps_its_record(
    store: Store, clock: ManualClock
) -> None:
    # A call that runs ten times its ttl, renewed every third of a lease: at no
    # point may a claim take the key over, a read miss it, or a purge delete it.
    ttl = LEASE
    token = (await store.claim("t", "k", "fp", lease=LEASE, ttl=ttl)).record.token
    for _ in range(30):
        clock.advance(LEASE / 3)
        assert await store.renew("t", "k", token, lease=LEASE)
        record = await store.get("t", "k")
        assert record is not None and record.state is RecordState.IN_PROGRESS
        assert record.expires_at >= record.lease_expires_at + LEASE
        assert (await claim(store))[0] is ClaimStatus.IN_PROGRESS
        await store.purge_expired()
        assert await store.get("t", "k") is not None, "purged while it ran"
    assert await store.complete("t", "k", token, RESPONSE, ttl=ttl)
    assert (await claim(store))[0] is ClaimStatus.COMPLETED


async def test_a_completed_answer_lives_ttl_after_it_was_stored(
    store: Store, clock: ManualClock
) -> None:
    claimed = await store.claim("t", "k", "fp", lease=LEASE, ttl=TTL)
    clock.advance(TTL - 10)  # a long run, renewed
    assert await store.renew("t", "k", claimed.record.token, lease=LEASE)
    completed_at = clock.now()
    assert await store.complete("t", "k", claimed.record.token, RESPONSE, ttl=TTL)
    record = await store.get("t", "k")
    assert record is not None and record.expires_at == completed_at + TTL
    clock.advance(TTL - 1)  # long after first use + ttl, within ttl of the answer
    result = await store.claim("t", "k", "fp", lease=LEASE, ttl=TTL)
    assert result.status is ClaimStatus.COMPLETED and result.record.response == RESPONSE
    await store.purge_expired()
    assert await store.get("t", "k") is not None
    clock.advance(2)
    assert await store.get("t", "k") is None, "past ttl after its answer"
    assert (await claim(store))[0] is ClaimStatus.ACQUIRED


async def test_a_completed_stream_keeps_its_events_for_ttl_after_it_was_stored(
    store: Store, clock: ManualClock
) -> None:
    token = (await store.claim("t", "s", "fp", lease=LEASE, ttl=LEASE)).record.token
    assert await store.begin_stream("t", "s", token, 200, ())
    for number in range(1, 11):
        clock.advance(LEASE / 3)
        assert await store.renew("t", "s", token, lease=LEASE)
        assert await store.append_events("t", "s", token, number, [b"e%d" % number])
    stream = StoredResponse(200, (), b"", stream=True)
    assert await store.complete("t", "s", token, stream, ttl=LEASE)
    clock.advance(LEASE - 1)
    await store.purge_expired()
    assert len(await store.read_events("t", "s")) == 10
