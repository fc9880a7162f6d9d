"""The gateway's upstream HTTP client (aiohttp).

aiohttp, not httpx, on this hot path: as a high-concurrency proxy client httpx
measured several times slower per request here (docs/benchmarks.md). Bodies are
relayed as received (``auto_decompress=False``) so a replay is byte-for-byte the
original.

Retries happen only when the request provably never left (DESIGN.md, Gateway
retries): aiohttp's ``ClientConnectorError`` covers refused connections, DNS
failures and connect timeouts. Anything after the request was written is
ambiguous, since the provider may be generating (and billing) already, so it is
reported, never retried here. ``ConnectionTimeoutError`` is aiohttp's connect
timeout (``sock_connect``): nothing was written either.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from payonce.errors import ConfigError, UpstreamTimeout, UpstreamUnavailable

__all__ = ["HOP_BY_HOP", "OpenResponse", "Upstream", "UpstreamResponse", "parse_upstream_url"]

# RFC 9110 section 7.6.1 connection-specific fields, plus the ones the proxy
# recomputes itself (host, content-length).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


@dataclass(frozen=True, slots=True)
class UpstreamResponse:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


def parse_upstream_url(url: str) -> URL:
    """Validate ``--upstream``: an absolute http(s) URL, optionally with a path prefix."""
    try:
        parsed = URL(url)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"--upstream: {url!r} is not a URL: {exc}") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigError(
            f"--upstream: {url!r} must be an http:// or https:// URL (or 'sim'),"
            " e.g. https://api.openai.com"
        )
    if parsed.query_string or parsed.fragment:
        raise ConfigError(f"--upstream: {url!r} must not carry a query or fragment")
    return parsed


class Upstream:
    """Sends one request to the upstream and reads the whole response."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float = 5.0,
        read_timeout: float = 600.0,
        connect_retries: int = 2,
        backoff: float = 0.05,
    ) -> None:
        self._base = parse_upstream_url(base_url)
        self._prefix = self._base.raw_path.rstrip("/")
        self._origin = str(self._base.origin())
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout, sock_read=read_timeout
        )
        self._connect_retries = connect_retries
        self._backoff = backoff
        self._session: aiohttp.ClientSession | None = None

    @property
    def server(self) -> tuple[str, int]:
        """The upstream's host and port (``server.address`` and ``server.port`` of spans)."""
        return str(self._base.host), int(self._base.port or 0)

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=15)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            auto_decompress=False,
            # One session serves every tenant: a cookie one upstream response sets
            # must never ride along on another tenant's request.
            cookie_jar=aiohttp.DummyCookieJar(),
            # Send what the client sent, no more: no default User-Agent or
            # Accept-Encoding of ours changes what the upstream computes.
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def url_for(self, raw_path: str, query: str) -> URL:
        target = self._origin + self._prefix + raw_path + ("?" + query if query else "")
        return URL(target, encoded=True)

    async def send(
        self,
        method: str,
        raw_path: str,
        query: str,
        headers: Iterable[tuple[str, str]],
        body: bytes,
    ) -> UpstreamResponse:
        """Forward one request and read the whole answer.

        Raises :class:`UpstreamUnavailable` or :class:`UpstreamTimeout`.
        """
        async with self.open(method, raw_path, query, headers, body) as response:
            return UpstreamResponse(response.status, response.headers, await response.read())

    @contextlib.asynccontextmanager
    async def open(
        self,
        method: str,
        raw_path: str,
        query: str,
        headers: Iterable[tuple[str, str]],
        body: bytes,
        *,
        on_attempt: Callable[[int], object] | None = None,
    ) -> AsyncIterator[OpenResponse]:
        """Forward one request; yield the response once its head has arrived.

        ``on_attempt(n)`` is told as attempt ``n`` (1, then connect retries) is
        sent, so a call cancelled before its answer still counts its attempts.

        The body is read through the yielded :class:`OpenResponse`. Leaving the
        block early (a cancelled relay) closes the connection, which is how an
        upstream learns that nobody is listening any more.
        """
        assert self._session is not None, "Upstream.start() was not awaited"
        url = self.url_for(raw_path, query)
        request_headers = CIMultiDict(headers)
        attempt = 0
        while True:
            if on_attempt is not None:
                on_attempt(attempt + 1)
            try:
                response = await self._session.request(
                    method, url, headers=request_headers, data=body or None, allow_redirects=False
                )
                break
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
                # Provably not sent: safe to try again, with full jitter.
                if attempt >= self._connect_retries:
                    raise UpstreamUnavailable(
                        f"cannot connect to the upstream {self._origin}: {exc}"
                    ) from exc
                await asyncio.sleep(random.uniform(0, self._backoff * 2**attempt))
                attempt += 1
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise _translate(exc) from exc
        complete = False
        try:
            yield OpenResponse(response, attempts=attempt + 1)
            complete = True
        finally:
            if complete and response.content.at_eof():
                response.release()  # back to the keep-alive pool
            else:
                response.close()


def _translate(exc: BaseException) -> UpstreamTimeout | UpstreamUnavailable:
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return UpstreamTimeout(
            "the upstream did not answer in time; retry with the same Idempotency-Key"
        )
    return UpstreamUnavailable(
        "the upstream connection failed after the request was sent"
        f" ({exc.__class__.__name__}); retry with the same Idempotency-Key"
    )


class OpenResponse:
    """An upstream response whose body is still to be read; errors come out translated."""

    def __init__(self, response: aiohttp.ClientResponse, attempts: int = 1) -> None:
        self._response = response
        self.attempts = attempts  # connections tried: 1 + connect retries
        self.status = response.status
        self.headers = tuple(
            (name, value)
            for name, value in response.headers.items()
            if name.lower() not in HOP_BY_HOP
        )
        self.content_type = response.headers.get("Content-Type")

    async def read(self) -> bytes:
        try:
            return await self._response.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _translate(exc) from exc

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives."""
        content = self._response.content
        while True:
            try:
                chunk = await content.readany()
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise _translate(exc) from exc
            if not chunk:
                return
            yield chunk
