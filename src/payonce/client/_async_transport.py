"""``AsyncIdempotentTransport``: the retry policy around any async httpx2 transport."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

import anyio
import httpx2

from payonce.client._budget import RetryBudget
from payonce.client._call import Action, Call, Lookup
from payonce.client._clock import RetryClock
from payonce.client._core import TransportCore, decoded_body, is_event_stream
from payonce.client._gateway import read_status, read_stored, response_request, status_request
from payonce.client._history import attach_to_exception, attach_to_response
from payonce.client._hooks import RetryHook
from payonce.client._policy import RetryPolicy

__all__ = ["AsyncIdempotentTransport"]

# The transport's own timeouts fire first; this cancel scope only catches a server
# that trickles bytes just fast enough to never trip a per-read timeout.
_DEADLINE_GRACE = 0.05


class AsyncIdempotentTransport(httpx2.AsyncBaseTransport):
    """The async twin of :class:`~payonce.client.IdempotentTransport` (same arguments).

    Runs under asyncio or trio (through anyio). Each attempt also runs inside a
    cancel scope that ends at the call's deadline, so an async call never
    outlives its deadline by more than a few milliseconds.
    """

    def __init__(
        self,
        transport: httpx2.AsyncBaseTransport | None = None,
        *,
        policy: RetryPolicy | None = None,
        gateway: bool | str | None = None,
        hooks: Iterable[RetryHook] | None = None,
        budget: RetryBudget | None = None,
        clock: RetryClock | None = None,
        key_factory: Callable[[], str] | None = None,
        tenant_header: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._transport = transport if transport is not None else httpx2.AsyncHTTPTransport()
        self._core = TransportCore(
            policy=policy,
            gateway=gateway,
            hooks=hooks,
            budget=budget,
            clock=clock,
            key_factory=key_factory,
            tenant_header=tenant_header,
            rng=rng,
        )

    @property
    def policy(self) -> RetryPolicy:
        return self._core.policy

    @property
    def budget(self) -> RetryBudget | None:
        return self._core.budget

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        core = self._core
        call = core.begin(request)
        await request.aread()  # make the body replayable for every attempt
        requested = request.extensions.get("timeout")
        while True:
            call.start_attempt()
            request.extensions = {**request.extensions, "timeout": call.attempt_timeouts(requested)}
            response: httpx2.Response | None = None
            error: httpx2.TransportError | None = None
            try:
                response, body = await self._send(request, call)
            except httpx2.TransportError as exc:
                error = exc
                step = call.on_error(exc)
            else:
                core.gateways.observe(request.url, response.headers, body)
                call.gateway = core.gateways.check_base(request.url) is not None
                step = call.on_response(response.status_code, response.headers, body)
            if step.action is Action.CHECK:
                lookup, stored = await self._check(request, call)
                step = call.after_check(lookup)
                if stored is not None:
                    attach_to_response(stored, call.history_tuple)
                    return stored
            if step.action is Action.RETRY:
                if response is not None:
                    await response.aclose()
                if step.wait > 0:
                    await core.clock.sleep_async(step.wait)
                continue
            if error is not None:
                attach_to_exception(error, call.history_tuple)
                raise error
            assert response is not None
            attach_to_response(response, call.history_tuple)
            return response

    async def _send(self, request: httpx2.Request, call: Call) -> tuple[httpx2.Response, bytes]:
        """One attempt, bounded by the deadline; the answer (buffered) and its error body."""
        try:
            with anyio.fail_after(max(call.time_left(), 0.0) + _DEADLINE_GRACE):
                response = await self._transport.handle_async_request(request)
                if is_event_stream(response):
                    return response, b""
                stream = response.stream
                assert isinstance(stream, httpx2.AsyncByteStream)
                chunks: list[bytes] = []
                try:
                    async for chunk in stream:
                        chunks.append(chunk)
                finally:
                    await response.aclose()
        except TimeoutError as exc:
            raise httpx2.ReadTimeout("the call's deadline passed", request=request) from exc
        raw = b"".join(chunks)
        buffered = self._core.rebuild(response, raw)
        body = decoded_body(response, raw) if response.status_code >= 400 else b""
        return buffered, body

    async def _check(
        self, request: httpx2.Request, call: Call
    ) -> tuple[Lookup, httpx2.Response | None]:
        """Ask the gateway about the call's key until it knows, or time runs out."""
        gateways = self._core.gateways
        base = gateways.check_base(request.url)
        if base is None:  # found out earlier in this call that it is no gateway
            return Lookup.NO_GATEWAY, None
        assert call.key is not None
        extra = self._core.status_headers
        checks = 0
        while call.time_left() > 0:
            checks += 1
            wait = call.check_wait()
            timeouts = call.attempt_timeouts(None) | {"read": max(call.time_left(), 0.001)}
            ask = status_request(base, call.key, wait, request.headers, extra, timeouts)
            try:
                answer, body = await self._fetch(ask, call)
                lookup = read_status(answer.status_code, answer.headers, body)
                gateways.observe(ask.url, answer.headers, body)
                if lookup is Lookup.UNKNOWN and gateways.base_for(request.url) is None:
                    gateways.not_a_gateway(request.url)
                    return Lookup.NO_GATEWAY, None
                if lookup is Lookup.COMPLETED:
                    ask = response_request(base, call.key, request.headers, extra, timeouts)
                    stored, body = await self._fetch(ask, call)
                    lookup = read_stored(stored.status_code, stored.headers, body)
                    if lookup is Lookup.COMPLETED:
                        return lookup, stored
            except httpx2.TransportError:
                if gateways.base_for(request.url) is None:
                    gateways.not_a_gateway(request.url)
                    return Lookup.NO_GATEWAY, None
                return Lookup.UNKNOWN, None
            if lookup is not Lookup.IN_PROGRESS or wait <= 0:
                return (Lookup.UNKNOWN if lookup is Lookup.IN_PROGRESS else lookup), None
            # Still running: the long-poll should have waited, but answers may come
            # back early (new stream events, an older gateway, a proxy's timeout).
            pause = call.check_pause(checks)
            if pause is None:
                break
            if pause > 0:
                await self._core.clock.sleep_async(pause)
        return Lookup.UNKNOWN, None

    async def _fetch(self, request: httpx2.Request, call: Call) -> tuple[httpx2.Response, bytes]:
        try:
            with anyio.fail_after(max(call.time_left(), 0.0) + _DEADLINE_GRACE):
                response = await self._transport.handle_async_request(request)
                stream = response.stream
                assert isinstance(stream, httpx2.AsyncByteStream)
                try:
                    raw = b"".join([chunk async for chunk in stream])
                finally:
                    await response.aclose()
        except TimeoutError as exc:
            raise httpx2.ReadTimeout("the call's deadline passed", request=request) from exc
        return self._core.rebuild(response, raw), decoded_body(response, raw)

    async def aclose(self) -> None:
        await self._transport.aclose()
