"""``IdempotentTransport``: the retry policy around any sync httpx2 transport."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

import httpx2

from payonce.client._budget import RetryBudget
from payonce.client._call import Action, Call, Lookup
from payonce.client._clock import RetryClock
from payonce.client._core import TransportCore, decoded_body, is_event_stream
from payonce.client._gateway import read_status, read_stored, response_request, status_request
from payonce.client._history import attach_to_exception, attach_to_response
from payonce.client._hooks import RetryHook
from payonce.client._policy import RetryPolicy

__all__ = ["IdempotentTransport"]


class IdempotentTransport(httpx2.BaseTransport):
    """Sends each request under a :class:`RetryPolicy`, with one ``Idempotency-Key`` per call.

    ``transport`` is the transport that really sends (default: a new
    ``httpx2.HTTPTransport()``). Each ``handle_request`` is one logical call: it
    keeps the caller's ``Idempotency-Key`` (or ``X-Idempotency-Key``) header, or
    sets a new UUID v4 from ``key_factory``, and sends that key on every attempt.
    Safe methods (GET, HEAD, OPTIONS, TRACE) get no key.

    ``gateway``: ``None`` recognises a payonce gateway from its answers; ``True``
    says the server is one; a URL says where its ``/_payonce/`` endpoints are;
    ``False`` never asks. ``tenant_header`` names the header the gateway scopes
    records by, if it runs with ``--tenant-header``; it is sent with status checks
    along with ``Authorization``, ``x-api-key`` and ``api-key``.

    Answers other than ``text/event-stream`` are read into memory inside the
    transport, so that a connection lost while reading the body is retried like
    any other ambiguous failure. Between chunks, the deadline is checked; each
    socket read is bounded by the time left when the attempt started.
    """

    def __init__(
        self,
        transport: httpx2.BaseTransport | None = None,
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
        self._transport = transport if transport is not None else httpx2.HTTPTransport()
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

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        core = self._core
        call = core.begin(request)
        request.read()  # make the body replayable for every attempt
        requested = request.extensions.get("timeout")
        while True:
            call.start_attempt()
            request.extensions = {**request.extensions, "timeout": call.attempt_timeouts(requested)}
            response: httpx2.Response | None = None
            error: httpx2.TransportError | None = None
            try:
                response, body = self._send(request, call)
            except httpx2.TransportError as exc:
                error = exc
                step = call.on_error(exc)
            else:
                core.gateways.observe(request.url, response.headers, body)
                call.gateway = core.gateways.check_base(request.url) is not None
                step = call.on_response(response.status_code, response.headers, body)
            if step.action is Action.CHECK:
                lookup, stored = self._check(request, call)
                step = call.after_check(lookup)
                if stored is not None:
                    attach_to_response(stored, call.history_tuple)
                    return stored
            if step.action is Action.RETRY:
                if response is not None:
                    response.close()
                if step.wait > 0:
                    core.clock.sleep(step.wait)
                continue
            if error is not None:
                attach_to_exception(error, call.history_tuple)
                raise error
            assert response is not None
            attach_to_response(response, call.history_tuple)
            return response

    def _send(self, request: httpx2.Request, call: Call) -> tuple[httpx2.Response, bytes]:
        """One attempt; returns the (buffered) answer and its decoded body if it is an error."""
        response = self._transport.handle_request(request)
        if is_event_stream(response):
            return response, b""
        stream = response.stream
        assert isinstance(stream, httpx2.SyncByteStream)
        chunks: list[bytes] = []
        try:
            for chunk in stream:
                chunks.append(chunk)
                if call.time_left() <= 0:
                    raise httpx2.ReadTimeout("deadline passed reading the body", request=request)
        finally:
            response.close()
        raw = b"".join(chunks)
        buffered = self._core.rebuild(response, raw)
        body = decoded_body(response, raw) if response.status_code >= 400 else b""
        return buffered, body

    def _check(self, request: httpx2.Request, call: Call) -> tuple[Lookup, httpx2.Response | None]:
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
                answer, body = self._fetch(ask)
                lookup = read_status(answer.status_code, answer.headers, body)
                gateways.observe(ask.url, answer.headers, body)
                if lookup is Lookup.UNKNOWN and gateways.base_for(request.url) is None:
                    gateways.not_a_gateway(request.url)
                    return Lookup.NO_GATEWAY, None
                if lookup is Lookup.COMPLETED:
                    ask = response_request(base, call.key, request.headers, extra, timeouts)
                    stored, body = self._fetch(ask)
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
                self._core.clock.sleep(pause)
        return Lookup.UNKNOWN, None

    def _fetch(self, request: httpx2.Request) -> tuple[httpx2.Response, bytes]:
        response = self._transport.handle_request(request)
        stream = response.stream
        assert isinstance(stream, httpx2.SyncByteStream)
        try:
            raw = b"".join(stream)
        finally:
            response.close()
        return self._core.rebuild(response, raw), decoded_body(response, raw)

    def close(self) -> None:
        self._transport.close()
