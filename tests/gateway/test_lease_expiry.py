"""The gateway's own copy of a running record's expiry follows the store's (issue 29, defect 3).

Pending writes give up at ``Lease.expires_at`` and the replay cache keeps
answers until it: a copy fixed at the claim gave up a long call's failed
``complete`` at once although its record was still held.
"""

from __future__ import annotations

import asyncio

from payonce.clock import ManualClock
from payonce.gateway.execution import Execution, renew_leases
from payonce.gateway.lease import Lease
from payonce.gateway.runs import RunTable
from payonce.store import MemoryStore

LEASE, TTL = 1.0, 3.0


async def test_renewals_move_the_runs_expiry_on_with_the_records() -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    claimed = (await store.claim("t", "k", "fp", lease=LEASE, ttl=TTL)).record
    lease = Lease.of(store, claimed, clock=clock, duration=LEASE, ttl=TTL)
    execution = Execution(lease, claimed.fingerprint)
    running: RunTable[Execution] = RunTable()
    running.start(execution)
    renewing = asyncio.create_task(renew_leases(running, LEASE))
    try:
        for _ in range(10):  # ten leases by the store's clock, renewed as they go
            clock.advance(LEASE / 2)
            await asyncio.sleep(LEASE / 2)
        record = await store.get("t", "k")
        assert record is not None, "the running call's record expired"
        assert clock.now() > claimed.created_at + TTL
        assert lease.expires_at > clock.now() + LEASE / 2, "the copy stayed at the claim's"
        assert lease.expires_at <= record.expires_at, "the copy must never be later"
    finally:
        renewing.cancel()
        await asyncio.gather(renewing, return_exceptions=True)
