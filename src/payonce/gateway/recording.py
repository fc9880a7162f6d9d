"""Reading an upstream stream to its end while relaying and recording it.

Events go to the :class:`LiveStream` (every client following it here) as they
arrive, and to the store in small batches (every ``FLUSH_EVENTS`` events or
``FLUSH_SECONDS``, whichever comes first), so other processes can follow and a
retry after completion replays the same events.

A stream counts as complete when the upstream ends its body cleanly. If the
upstream dies mid-way, the record is released: what was recorded is dropped
and a retry runs the request again (a provider does not bill an unfinished
generation either). If recording fails (store down, lease lost), the stream is
still relayed to the end but not completed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Callable

from payonce.errors import ProblemError, StorageError
from payonce.gateway.live import LiveStream
from payonce.gateway.observing import UpstreamFacts
from payonce.gateway.pending import PendingWrites, Until
from payonce.gateway.sse import EventSplitter, StreamId, StreamUsage, failed_in_band
from payonce.gateway.upstream import OpenResponse
from payonce.observe.pricing import cost_of
from payonce.store import Store, StoredResponse

__all__ = ["FLUSH_EVENTS", "FLUSH_SECONDS", "record_stream", "release_quietly"]

log = logging.getLogger("payonce.gateway")

FLUSH_EVENTS = 64
FLUSH_SECONDS = 0.05


async def release_quietly(
    store: Store,
    tenant: str,
    key: str,
    token: str,
    pending: PendingWrites | None = None,
    until: Until = math.inf,
) -> None:
    """Release the key; if the store is down, leave the release to ``pending`` (retried)."""
    try:
        await store.release(tenant, key, token)
    except StorageError as exc:
        log.error("could not release key %r (retried when the store is back): %s", key, exc)
        if pending is not None:
            pending.add("release", key, functools.partial(store.release, tenant, key, token), until)


class _Recorder:
    """Batches events into :meth:`Store.append_events` calls; stops at the first failure."""

    def __init__(
        self,
        store: Store,
        tenant: str,
        key: str,
        token: str,
        live: LiveStream,
        max_stored: int | None = None,
    ) -> None:
        self.store, self.tenant, self.key, self.token = store, tenant, key, token
        self.live = live
        self.pending: list[bytes] = []
        self.recorded = 0
        self.ok = True
        # Bytes of events left before --max-stored-body is passed (None: no bound).
        self.room = max_stored
        self.too_large = False
        self._last_flush = asyncio.get_running_loop().time()
        self._begun: asyncio.Task[None] | None = None

    def begin(self, status: int, headers: tuple[tuple[str, str], ...]) -> None:
        """Start recording in the background: relaying the first event must not wait for it."""
        self._begun = asyncio.get_running_loop().create_task(self._begin(status, headers))

    async def _begin(self, status: int, headers: tuple[tuple[str, str], ...]) -> None:
        try:
            held = await self.store.begin_stream(self.tenant, self.key, self.token, status, headers)
        except StorageError as exc:
            log.error("cannot record the stream of key %r: %s", self.key, exc)
            held = False
        # Events may have passed --max-stored-body meanwhile: that stop stands.
        self.ok = self.ok and held

    async def add(self, events: list[bytes]) -> None:
        if self.room is not None:
            self.room -= sum(map(len, events))
            if self.room < 0:
                # Recording stops; what is recorded stays (slow followers here may
                # still read it back) until the key is released at the stream's end.
                if not self.too_large:
                    log.info(
                        "the stream of key %r passed --max-stored-body: relayed, not stored",
                        self.key,
                    )
                self.too_large, self.ok = True, False
                self.pending.clear()
                return
        self.pending.extend(events)
        now = asyncio.get_running_loop().time()
        if len(self.pending) >= FLUSH_EVENTS or now - self._last_flush >= FLUSH_SECONDS:
            await self.flush()

    async def flush(self) -> None:
        self._last_flush = asyncio.get_running_loop().time()
        if self._begun is not None:
            await self._begun
        if not self.pending or not self.ok:
            self.pending.clear()
            return
        batch, self.pending = self.pending, []
        try:
            held = await self.store.append_events(
                self.tenant, self.key, self.token, self.recorded + 1, batch
            )
        except StorageError as exc:
            log.error("stopped recording the stream of key %r: %s", self.key, exc)
            held = False
        if held:
            self.recorded += len(batch)
            self.live.trim(self.recorded)
        else:
            self.ok = False


async def record_stream(
    store: Store,
    tenant: str,
    key: str,
    token: str,
    response: OpenResponse,
    live: LiveStream,
    *,
    strip_usage: bool,
    on_last_event: Callable[[], object],
    joined: Callable[[], int],
    facts: UpstreamFacts,
    pending: PendingWrites | None = None,
    until: Until = math.inf,
    max_stored: int | None = None,
    ttl: float,
) -> StoredResponse | None:
    """Relay ``response`` into ``live``, record it, then complete or release the record.

    Events past ``max_stored`` bytes are relayed and not recorded; the record is
    then released (``facts.not_stored``), so a retry runs again. A completed
    stream is replayed for ``ttl`` (:meth:`Store.complete`).
    """
    recorder = _Recorder(store, tenant, key, token, live, max_stored)
    recorder.begin(response.status, response.headers)
    splitter = EventSplitter()
    usage = StreamUsage()
    # Without a request-id header, the stream's own id is the join key with the bill.
    stream_id = None if facts.request_id is not None else StreamId()

    async def take(events: list[bytes]) -> None:
        if stream_id is not None and not stream_id.done:
            for event in events:
                if stream_id.feed(event):
                    facts.request_id = stream_id.value
                    break
        # The usage chunk the gateway asked for on the client's behalf is not relayed.
        kept = [event for event in events if not (usage.inspect(event) and strip_usage)]
        if facts.not_stored is None and any(failed_in_band(event) for event in kept):
            facts.not_stored = "upstream_error"  # relayed, never replayed: see below
        if kept:
            live.append(kept)
            await recorder.add(kept)
            if recorder.too_large:
                facts.not_stored = "too_large"

    try:
        async for chunk in response.chunks():
            await take(splitter.feed(chunk))
        await take(splitter.close())
    except ProblemError as exc:
        log.warning("the upstream stream of key %r broke off: %s", key, exc.detail)
        facts.usage_missing = "no_response"
        on_last_event()
        live.finish(failed=True)
        await release_quietly(store, tenant, key, token, pending, until)
        return None
    await recorder.flush()
    on_last_event()
    facts.model, facts.usage = usage.model, usage.usage
    facts.cost_usd = cost_of(usage.model, usage.usage)
    try:
        if not recorder.ok or facts.not_stored == "upstream_error":
            # An error event on a 200 (Anthropic's overloaded_error, OpenRouter's
            # error chunk): no whole answer, none billed, so a retry runs again.
            await release_quietly(store, tenant, key, token, pending, until)
            return None
        stored = StoredResponse(response.status, response.headers, b"", stream=True)
        completed = await store.complete(
            tenant,
            key,
            token,
            stored,
            usage=facts.usage,
            cost_usd=facts.cost_usd,
            replays=joined(),
            ttl=ttl,
        )
    except StorageError as exc:
        log.error("could not complete the stream of key %r (retried later): %s", key, exc)
        if pending is not None:
            late = functools.partial(
                store.complete,
                tenant,
                key,
                token,
                stored,
                usage=facts.usage,
                cost_usd=facts.cost_usd,
                replays=joined(),
                ttl=ttl,
            )
            pending.add("complete", key, late, until)
        return None
    finally:
        live.finish()
    return stored if completed else None
