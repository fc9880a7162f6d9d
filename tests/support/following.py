"""A stream running under one store and a follower waiting on it through another.

Two stores on one backend stand for two processes (two workers, two replicas):
the owner claims a key and begins its stream, the follower waits on the record
as a gateway relaying another process's run does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from payonce.store import Store

HEAD = (("content-type", "text/event-stream"),)
LEASE, TTL = 30.0, 3600.0


async def running_stream(store: Store, key: str = "k") -> str:
    """Claim ``key`` of tenant ``t`` and begin its stream; the holder's token."""
    claim = await store.claim("t", key, "fp", lease=LEASE, ttl=TTL)
    token = claim.record.token
    assert await store.begin_stream("t", key, token, 200, HEAD)
    return token


@contextlib.asynccontextmanager
async def following(follower: Store, key: str = "k") -> AsyncIterator[None]:
    """The follower waits on the record meanwhile, as a gateway relaying another's run."""
    waiting = asyncio.create_task(follower.wait("t", key, 30))
    try:
        yield
    finally:
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
