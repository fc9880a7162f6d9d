"""Following a recorded stream never relays another run's events after this run's.

A store keeps a stream's events by key, not by run: when run A is released and
run B records events under the same key, a follower of A that reads before it
looks at the record would read B's events as A's continuation (issue 29, defect
4, the same splice as a resumed stream). Timing on real processes cannot place
B's events between a follower's read and its check, so this test drives the
real in-memory store and the relay by hand; the ASGI ``send`` only collects.
"""

from __future__ import annotations

import asyncio
from typing import Any

from payonce.clock import ManualClock
from payonce.gateway.relay import relay_stored
from payonce.gateway.sse import run_tag
from payonce.store import StoredResponse
from payonce.store.memory import MemoryStore

HEADERS = (("content-type", "text/event-stream"),)


async def test_a_follower_of_a_released_run_never_gets_the_next_runs_events() -> None:
    clock = ManualClock(1000.0)
    store = MemoryStore(clock)
    a = (await store.claim("t", "k", "fp", lease=30, ttl=3600)).record
    assert await store.begin_stream("t", "k", a.token, 200, HEADERS)
    assert await store.append_events("t", "k", a.token, 1, [b"data: a%d\n\n" % n for n in range(3)])
    following = await store.get("t", "k")
    assert following is not None and following.streaming
    # A dies and is released; B claims the key and records more events than A had.
    assert await store.release("t", "k", a.token)
    b = (await store.claim("t", "k", "fp", lease=30, ttl=3600)).record
    assert await store.begin_stream("t", "k", b.token, 200, HEADERS)
    assert await store.append_events("t", "k", b.token, 1, [b"data: b%d\n\n" % n for n in range(6)])
    assert await store.complete(
        "t", "k", b.token, StoredResponse(200, HEADERS, b"", stream=True), ttl=3600
    )

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()  # the client stays
        return {}

    marker = (b"idempotent-replayed", b"true")
    await relay_stored(send, receive, store, following, marker, after=3, clock=clock)
    body = b"".join(message.get("body", b"") for message in sent)
    assert b"data: b" not in body, "B's events after A's"
    assert sent[-1].get("more_body", True), "ended broken, not as a whole stream"
    # B's own follower gets B's events, named by B's run.
    sent.clear()
    done = await store.get("t", "k")
    assert done is not None
    await relay_stored(send, receive, store, done, marker, after=3, clock=clock)
    body = b"".join(message.get("body", b"") for message in sent)
    assert body.count(b"data: b") == 3 and b"id: 4-%s\n" % run_tag(b.token) in body
