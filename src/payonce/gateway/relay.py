"""Sending responses to the client: whole ones, and event streams (live, stored, or both).

Every streamed event goes out framed by :func:`~payonce.gateway.sse.relayed`:
numbered with its run (``id: N-<run>``) so a client can resume with
``Last-Event-ID``, comments bare. A client that disconnects stops its relay,
never the upstream run behind it (that one belongs to the key, not to this client).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from typing import Any

from payonce.clock import Clock
from payonce.gateway.asgi import BodyWriter, Receive, Send, break_response, send_response
from payonce.gateway.live import LiveStream, Push
from payonce.gateway.sse import NUMBERED, relayed, run_tag
from payonce.gateway.upstream import UpstreamResponse
from payonce.store import Record, RecordState, Store, StoredResponse

__all__ = [
    "relay_live",
    "relay_stored",
    "send_whole",
    "watch_disconnect",
]


async def send_whole(
    send: Send, response: UpstreamResponse | StoredResponse, *extra: tuple[bytes, bytes]
) -> None:
    """Send a whole response with ``extra`` headers (the replay marker, the cost)."""
    raw = response.raw_headers if isinstance(response, UpstreamResponse) else None
    if raw is not None:
        headers = [*raw, *extra]
    else:
        headers = [
            (name.encode("latin-1"), value.encode("latin-1")) for name, value in response.headers
        ]
        headers.extend(extra)
    await send_response(send, response.status, headers, response.body)


@contextlib.contextmanager
def watch_disconnect(receive: Receive) -> Any:
    """Yield a callable that tells whether the client has gone, watched by one task."""
    watcher = asyncio.ensure_future(receive())

    def gone() -> bool:
        return (
            watcher.done()
            and not watcher.cancelled()
            and watcher.exception() is None
            and watcher.result()["type"] == "http.disconnect"
        )

    try:
        yield gone
    finally:
        watcher.cancel()


async def _start_stream(
    send: Send, status: int, headers: tuple[tuple[str, str], ...], marker: tuple[bytes, bytes]
) -> None:
    encoded = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]
    encoded.append(marker)
    await send({"type": "http.response.start", "status": status, "headers": encoded})


def _framed(events: list[bytes], before: int, run: bytes) -> bytes:
    """Events numbered ``before + 1``, ... as a client gets them."""
    return b"".join([relayed(event, before + n, run) for n, event in enumerate(events, 1)])


async def _pump(
    send: Send,
    batches: AsyncGenerator[tuple[int, list[bytes]]],
    after: int,
    run: bytes,
    gone: Callable[[], bool],
    seen: Callable[[list[bytes]], object] | None = None,
) -> bool:
    """Send framed batches of ``run``'s events; False when the client left or the source
    broke off."""
    number = after
    try:
        # aclosing: a client that leaves must stop following at once (LiveStream
        # counts its followers in the generator's finally).
        async with contextlib.aclosing(batches):
            async for before, batch in batches:
                if seen is not None:
                    seen(batch)
                number = before + len(batch)
                body = _framed(batch, before, run)
                await send({"type": "http.response.body", "body": body, "more_body": True})
                if gone():
                    return False
    except ConnectionError as exc:
        # The upstream died mid-stream: end without the final chunk, so the
        # client sees a broken stream rather than a short, clean one.
        break_response(f"after event {number}: {exc}")
        return False
    return True


async def relay_live(
    send: Send,
    receive: Receive,
    live: LiveStream,
    marker: tuple[bytes, bytes],
    after: int,
    token: str,
    write: BodyWriter | None = None,
) -> bool:
    """Relay a stream running in this process (the run holding ``token``): what it has
    so far, then what comes.

    With the server's ``write`` (:data:`~payonce.gateway.asgi.BodyWriter`), events
    that arrive while the client is caught up are written by the run as it
    appends them (:meth:`LiveStream.follow`): no task of this client's wakes per
    event. Returns True when the client left before the end.
    """
    await _start_stream(send, live.status, live.headers, marker)
    run = run_tag(token)
    push: Push | None = None
    if write is not None:

        def push(events: list[bytes], before: int) -> bool:
            if len(events) == 1:  # at token rate, a read is one event
                event = events[0]
                if event[:5] == b"data:" and event[-2:] == b"\n\n":
                    # relayed's first case spelled out: a call fewer per event
                    return write(NUMBERED % (event[:-1], before + 1, run))
                return write(relayed(event, before + 1, run))
            return write(_framed(events, before, run))

    with watch_disconnect(receive) as gone:
        if await _pump(send, live.follow(after, push), after, run, gone):
            await send({"type": "http.response.body", "body": b""})
        return bool(gone())


async def relay_stored(
    send: Send,
    receive: Receive,
    store: Store,
    record: Record,
    marker: tuple[bytes, bytes],
    after: int,
    clock: Clock,
    poll: float = 1.0,
    seen: Callable[[list[bytes]], object] | None = None,
) -> None:
    """Relay a recorded stream: complete, or still being recorded by another process.

    A stream whose run is released, taken over, or abandoned (its holder's lease
    lapsed: nobody will record another event) ends broken, like one whose
    upstream died, so that its client retries. ``seen`` is shown each batch of
    events before it is sent.
    """
    assert record.response is not None
    await _start_stream(send, record.response.status, record.response.headers, marker)
    batches = _stored_batches(store, record, after, poll, clock)
    with watch_disconnect(receive) as gone:
        if await _pump(send, batches, after, run_tag(record.token), gone, seen):
            await send({"type": "http.response.body", "body": b""})


async def _stored_batches(
    store: Store, record: Record, after: int, poll: float, clock: Clock
) -> AsyncGenerator[tuple[int, list[bytes]]]:
    position = after
    tenant, key = record.tenant, record.key
    current: Record | None = record
    while True:
        events = await store.read_events(tenant, key, position)
        # Events are stored by key, not by run: whose these are is known only by
        # looking at the record after reading them. Its token then is the one it
        # had when they were read (a run that lost the key never gets it back),
        # and a completed record no longer changes. So a run that replaced this
        # one meanwhile has its events dropped here, never relayed after ours.
        if current is None or current.state is not RecordState.COMPLETED:
            current = await store.get(tenant, key)
        if current is None or current.token != record.token:
            raise ConnectionError("the stream's run was released before it completed")
        if events:
            yield position, events
            position += len(events)
        if current.state is RecordState.COMPLETED:
            if position >= current.events:
                return
            continue
        if not events and current.lease_lapsed(clock.now()):
            # Store.wait returns at once on a lapsed lease: without this the
            # loop would re-read the dead record as fast as the store answers.
            raise ConnectionError("the stream's run was abandoned: its gateway stopped")
        if current.state is RecordState.IN_PROGRESS and not events:
            current = await store.wait(tenant, key, poll) or current
