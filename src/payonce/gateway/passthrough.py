"""Requests forwarded without a key: proxied as they are, nothing claimed or stored.

Also a keyed request while the store is down under ``--on-store-failure open``.
Without a key nobody can claim the answer, so by default a client that leaves
stops the upstream call (``--on-disconnect cancel``); the call log still says
what the upstream did (docs/call-log.md, ``upstream_cancelled``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Coroutine
from typing import Any

from payonce.config import GatewaySettings
from payonce.errors import StorageError
from payonce.gateway.asgi import Receive, Send
from payonce.gateway.observing import Observer, UpstreamFacts, provider_request_id
from payonce.gateway.relay import send_whole
from payonce.gateway.request import ProxiedRequest
from payonce.gateway.sse import StreamId, is_event_stream
from payonce.gateway.upstream import OpenResponse, Upstream, UpstreamResponse
from payonce.gateway.upstream_http import Take
from payonce.observe.calllog import CallRecord
from payonce.observe.metrics import Metrics
from payonce.observe.pricing import priced_call
from payonce.observe.usage import model_usage_and_id

__all__ = ["VIA", "PassThrough"]

log = logging.getLogger("payonce.gateway")

VIA = (b"via", b"1.1 payonce")


async def _send_head(send: Send, response: OpenResponse) -> None:
    """The answer to a HEAD: the upstream's header fields, its Content-Length included.

    RFC 9110 section 9.3.2: a HEAD's answer carries the fields a GET's would,
    and its Content-Length is the length of the body a GET would get, not of
    the empty body that follows (uvicorn sends none after a HEAD's head). An
    upstream that declared no length gets none from the gateway either.
    """
    headers = [*response.raw_headers, VIA]
    if response.declared_length is not None:
        headers.append((b"content-length", response.declared_length))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


class PassThrough:
    """Forwards unkeyed requests for one gateway (its settings, upstream and observer)."""

    def __init__(
        self,
        settings: GatewaySettings,
        upstream: Upstream,
        observer: Observer,
        metrics: Metrics | None,
    ) -> None:
        self.settings = settings
        self.upstream = upstream
        self.observer = observer
        self.metrics = metrics
        self._unprotected_warned = -math.inf

    async def forward(
        self, request: ProxiedRequest, receive: Receive, send: Send, record: CallRecord
    ) -> None:
        forward = self._forward_unkeyed(request, send, record)
        if self.settings.on_disconnect == "continue":
            await forward
        else:
            await self._cancel_on_disconnect(forward, receive)

    async def forward_unprotected(
        self,
        request: ProxiedRequest,
        receive: Receive,
        send: Send,
        record: CallRecord,
        error: StorageError,
    ) -> None:
        """``--on-store-failure open``: a keyed request forwarded as if it had no key.

        Nothing is claimed or stored, so duplicates of it may each run (and be
        billed) until the store is back; they are counted and logged as such.
        """
        if self.settings.on_store_failure != "open":
            raise error
        now = time.monotonic()
        if now - self._unprotected_warned >= 10.0:  # once per 10 s during an outage
            self._unprotected_warned = now
            log.warning("store unavailable, forwarding keyed requests unprotected: %s", error)
        record.outcome = "passthrough"
        record.store_bypassed = True
        if self.metrics is not None:
            self.metrics.unprotected_forwards.inc()
        await self.forward(request, receive, send, record)

    async def _forward_unkeyed(
        self, request: ProxiedRequest, send: Send, record: CallRecord
    ) -> None:
        facts = UpstreamFacts(started=time.perf_counter())
        if self.observer.tracing is not None:
            self.observer.tracing.start_upstream(facts, record)
        try:
            await self._relay_unkeyed(request, send, facts)
        except asyncio.CancelledError:
            facts.cancelled = True  # its client left (--on-disconnect cancel) or shutdown
            raise
        finally:
            facts.latency = time.perf_counter() - facts.started
            self.observer.upstream_call(facts, request.raw_path)
            self.observer.apply(record, facts, saved=False)

    async def _relay_unkeyed(
        self, request: ProxiedRequest, send: Send, facts: UpstreamFacts
    ) -> None:
        async with self.upstream.open(
            request.method,
            request.raw_path,
            request.query,
            request.upstream_headers(),
            request.body,
            on_attempt=facts.sent,
        ) as response:
            facts.status, facts.attempts = response.status, response.attempts
            facts.request_id = provider_request_id(response.headers)
            if request.method == "HEAD":
                await _send_head(send, response)
                return
            if not is_event_stream(response.content_type):
                body = await response.read()
                facts.model, facts.usage, body_id = model_usage_and_id(body, response.headers)
                facts.request_id = facts.request_id or body_id
                facts.cost_usd, facts.price_source, facts.list_cost_usd = priced_call(
                    facts.model, facts.usage
                )
                raw = response.raw_headers
                whole = UpstreamResponse(response.status, response.headers, body, raw)
                await send_whole(send, whole, VIA)
                return
            facts.stream = True
            # A stream nobody can claim: relayed chunk by chunk, nothing recorded
            # and its usage not read.
            facts.usage_missing = "not_read"
            headers = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in response.headers]
            headers.append(VIA)
            await send(
                {"type": "http.response.start", "status": response.status, "headers": headers}
            )
            # Without a request-id header, the stream's own id is the join key.
            stream_id = StreamId() if facts.request_id is None else None

            def seen(chunk: bytes) -> None:
                nonlocal stream_id
                if stream_id is not None and stream_id.feed(chunk):
                    facts.request_id, stream_id = stream_id.value, None

            # Chunks go straight to the socket as they arrive where the server
            # allows it (they wait for nothing then), without this task waking;
            # else, or when the client is slow, as ASGI messages (gateway/asgi.py,
            # BodyWriter). With the request id from a header (OpenAI's, Anthropic's)
            # a chunk is not looked at: the server's writer is ``take`` itself, two
            # calls fewer per relayed event than through a function of ours
            # (benchmarks/NOTEBOOK.md, "An event's calls counted").
            write = request.write_body
            take: Take | None = write
            if write is not None and stream_id is not None:

                def take(chunk: bytes) -> bool:
                    if not write(chunk):
                        return False
                    seen(chunk)
                    return True

            async for chunk in response.chunks(take):
                seen(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    @staticmethod
    async def _cancel_on_disconnect(work: Coroutine[Any, Any, None], receive: Receive) -> None:
        # Without a key nobody can claim the result, so a client that leaves
        # should stop the generation (and its bill) where the provider allows:
        # leaving the upstream request's block closes its connection.
        # The work runs in this task; one watcher task cancels it on disconnect.
        current = asyncio.current_task()
        assert current is not None
        gone = False

        def on_message(watcher: asyncio.Task[Any]) -> None:
            nonlocal gone
            if (
                not watcher.cancelled()
                and watcher.exception() is None
                and watcher.result()["type"] == "http.disconnect"
            ):
                gone = True
                current.cancel()

        watcher = asyncio.ensure_future(receive())
        watcher.add_done_callback(on_message)
        try:
            await work
        except asyncio.CancelledError:
            if not gone:
                raise
            current.uncancel()
        finally:
            watcher.remove_done_callback(on_message)
            watcher.cancel()
