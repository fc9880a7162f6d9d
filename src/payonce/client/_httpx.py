"""The payonce transports under an SDK built on httpx (openai 1.x and 2.x, anthropic 1.x).

The transports speak httpx2, the HTTP client of openai 3.x and anthropic 2.x;
the older SDKs send through an ``httpx.Client``, whose transport must be an
``httpx`` transport. Rather than a second copy of the retry machinery, two thin
adapters carry requests, responses (streamed, chunk by chunk, as the server
sent them) and errors across, both ways:

    httpx.Client ─► HttpxTransport ─► IdempotentTransport ─► _Httpx2Over ─► httpx transport
                    (httpx → httpx2)   (the policy, httpx2)   (httpx2 → httpx)

An error is carried as the other library's class of the same name
(``ReadTimeout`` stays a ``ReadTimeout``), so the policy classifies what the
network did, and the SDK sees the error it knows (``APITimeoutError``).
``httpx`` is imported here only: payonce does not depend on it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import httpx2

from payonce.client._async_transport import AsyncIdempotentTransport
from payonce.client._policy import RetryPolicy
from payonce.client._transport import IdempotentTransport

__all__ = ["AsyncHttpxTransport", "HttpxTransport", "http_client_for"]

# What a response carries across besides status, headers and body: its HTTP
# version and reason, and the attempt history the policy attached.
_RESPONSE_EXTENSIONS = ("http_version", "reason_phrase", "payonce_attempts")


def _carried(exc: Exception, target: Any, request: Any) -> Exception:
    """``exc`` (an httpx or httpx2 error) as the ``target`` library's error of its name."""
    kind = getattr(target, type(exc).__name__, None)
    if not (isinstance(kind, type) and issubclass(kind, target.TransportError)):
        kind = target.TransportError
    carried: Exception = kind(str(exc), request=request)
    for name in ("payonce_attempts", "__notes__"):  # the history the policy attached
        if hasattr(exc, name):
            setattr(carried, name, getattr(exc, name))
    return carried


def _extensions(response: Any) -> dict[str, Any]:
    return {k: v for k, v in response.extensions.items() if k in _RESPONSE_EXTENSIONS}


# -- httpx2 requests sent through an httpx transport (below the policy) --------


class _Httpx2Over(httpx2.BaseTransport):
    def __init__(self, transport: httpx.BaseTransport) -> None:
        self._transport = transport

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        sent = httpx.Request(
            request.method,
            str(request.url),
            headers=request.headers.raw,
            content=request.read(),
            extensions=dict(request.extensions),
        )
        try:
            response = self._transport.handle_request(sent)
        except httpx.TransportError as exc:
            raise _carried(exc, httpx2, request) from exc
        return httpx2.Response(
            response.status_code,
            headers=response.headers.raw,
            stream=_Body2(response, request),
            extensions=_extensions(response),
        )

    def close(self) -> None:
        self._transport.close()


class _Body2(httpx2.SyncByteStream):
    def __init__(self, response: httpx.Response, request: httpx2.Request) -> None:
        self._response, self._request = response, request

    def __iter__(self) -> Iterator[bytes]:
        stream = self._response.stream
        assert isinstance(stream, httpx.SyncByteStream)
        try:
            yield from stream
        except httpx.TransportError as exc:
            raise _carried(exc, httpx2, self._request) from exc

    def close(self) -> None:
        self._response.close()


class _AsyncHttpx2Over(httpx2.AsyncBaseTransport):
    def __init__(self, transport: httpx.AsyncBaseTransport) -> None:
        self._transport = transport

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        sent = httpx.Request(
            request.method,
            str(request.url),
            headers=request.headers.raw,
            content=await request.aread(),
            extensions=dict(request.extensions),
        )
        try:
            response = await self._transport.handle_async_request(sent)
        except httpx.TransportError as exc:
            raise _carried(exc, httpx2, request) from exc
        return httpx2.Response(
            response.status_code,
            headers=response.headers.raw,
            stream=_AsyncBody2(response, request),
            extensions=_extensions(response),
        )

    async def aclose(self) -> None:
        await self._transport.aclose()


class _AsyncBody2(httpx2.AsyncByteStream):
    def __init__(self, response: httpx.Response, request: httpx2.Request) -> None:
        self._response, self._request = response, request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        stream = self._response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        try:
            async for chunk in stream:
                yield chunk
        except httpx.TransportError as exc:
            raise _carried(exc, httpx2, self._request) from exc

    async def aclose(self) -> None:
        await self._response.aclose()


# -- the policy as an httpx transport (above it) ---------------------------------


class HttpxTransport(httpx.BaseTransport):
    """An :class:`IdempotentTransport` for an ``httpx.Client``; ``transport`` really sends."""

    def __init__(self, transport: httpx.BaseTransport, **options: Any) -> None:
        self._policy = IdempotentTransport(_Httpx2Over(transport), **options)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        sent = httpx2.Request(
            request.method,
            str(request.url),
            headers=request.headers.raw,
            content=request.read(),
            extensions=dict(request.extensions),
        )
        try:
            response = self._policy.handle_request(sent)
        except httpx2.TransportError as exc:
            raise _carried(exc, httpx, request) from exc
        return httpx.Response(
            response.status_code,
            headers=response.headers.raw,
            stream=_Body(response, request),
            extensions=_extensions(response),
        )

    def close(self) -> None:
        self._policy.close()


class _Body(httpx.SyncByteStream):
    def __init__(self, response: httpx2.Response, request: httpx.Request) -> None:
        self._response, self._request = response, request

    def __iter__(self) -> Iterator[bytes]:
        stream = self._response.stream
        assert isinstance(stream, httpx2.SyncByteStream)
        try:
            yield from stream
        except httpx2.TransportError as exc:
            raise _carried(exc, httpx, self._request) from exc

    def close(self) -> None:
        self._response.close()


class AsyncHttpxTransport(httpx.AsyncBaseTransport):
    """An :class:`AsyncIdempotentTransport` for an ``httpx.AsyncClient``."""

    def __init__(self, transport: httpx.AsyncBaseTransport, **options: Any) -> None:
        self._policy = AsyncIdempotentTransport(_AsyncHttpx2Over(transport), **options)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        sent = httpx2.Request(
            request.method,
            str(request.url),
            headers=request.headers.raw,
            content=await request.aread(),
            extensions=dict(request.extensions),
        )
        try:
            response = await self._policy.handle_async_request(sent)
        except httpx2.TransportError as exc:
            raise _carried(exc, httpx, request) from exc
        return httpx.Response(
            response.status_code,
            headers=response.headers.raw,
            stream=_AsyncBody(response, request),
            extensions=_extensions(response),
        )

    async def aclose(self) -> None:
        await self._policy.aclose()


class _AsyncBody(httpx.AsyncByteStream):
    def __init__(self, response: httpx2.Response, request: httpx.Request) -> None:
        self._response, self._request = response, request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        stream = self._response.stream
        assert isinstance(stream, httpx2.AsyncByteStream)
        try:
            async for chunk in stream:
                yield chunk
        except httpx2.TransportError as exc:
            raise _carried(exc, httpx, self._request) from exc

    async def aclose(self) -> None:
        await self._response.aclose()


# The SDKs' own pool limits (openai._constants.DEFAULT_CONNECTION_LIMITS).
_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100)


def http_client_for(
    current: object, transport: object, policy: RetryPolicy, options: dict[str, Any]
) -> tuple[httpx.Client | httpx.AsyncClient, httpx.Timeout]:
    """The httpx client :func:`~payonce.client.protect` gives an SDK built on httpx, and
    the timeout to give the SDK with it."""
    timeout = httpx.Timeout(policy.read_timeout, connect=policy.connect_timeout)
    if isinstance(current, httpx.AsyncClient):
        inner = transport or httpx.AsyncHTTPTransport(limits=_LIMITS)
        if not isinstance(inner, httpx.AsyncBaseTransport):
            raise TypeError("an async httpx client needs an httpx.AsyncBaseTransport")
        transport_ = AsyncHttpxTransport(inner, **options)
        return (
            httpx.AsyncClient(transport=transport_, timeout=timeout, follow_redirects=True),
            timeout,
        )
    inner_sync = transport or httpx.HTTPTransport(limits=_LIMITS)
    if not isinstance(inner_sync, httpx.BaseTransport):
        raise TypeError("a sync httpx client needs an httpx.BaseTransport")
    sync = HttpxTransport(inner_sync, **options)
    return httpx.Client(transport=sync, timeout=timeout, follow_redirects=True), timeout
