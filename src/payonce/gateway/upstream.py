"""The gateway's upstream HTTP client: one origin, keep-alive HTTP/1.1 (gateway/upstream_http.py).

Not httpx, nor aiohttp's ``ClientSession`` any more, on this hot path: as a
proxy client to one origin both cost several times what a pool of httptools-parsed
connections costs per request (benchmarks/NOTEBOOK.md). Bodies are relayed as
received (no decompression) so a replay is byte-for-byte the original.

Retries happen only when the request provably never left (docs/gateway.md, Gateway
retries): a refused connection, a DNS failure, a failed TLS handshake or a
connect timeout (:class:`ConnectFailed`). Anything after the request was
written is ambiguous, since the provider may be generating (and billing)
already, so it is reported, never retried here.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

from yarl import URL

from payonce.errors import ConfigError, UpstreamTimeout, UpstreamUnavailable
from payonce.gateway.sse import EventSplitter, StreamEnd, is_event_stream
from payonce.gateway.upstream_http import ConnectFailed, Connection, Pool, Take, request_head

__all__ = [
    "HOP_BY_HOP",
    "HOP_BY_HOP_BYTES",
    "Exchange",
    "OpenResponse",
    "Upstream",
    "UpstreamResponse",
    "parse_upstream_url",
]

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
# The same, as the lowercase bytes the ASGI server hands over.
HOP_BY_HOP_BYTES = frozenset(name.encode() for name in HOP_BY_HOP)
# Not relayed from a response either: the gateway says itself whether its answer is
# a replay. An upstream that is an idempotency layer too (another payonce, say) says
# so about its own hop, and two such fields would leave the client guessing.
_NOT_RELAYED = HOP_BY_HOP_BYTES | {b"idempotent-replayed"}


@dataclass(frozen=True, slots=True)
class UpstreamResponse:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    # The same fields as the bytes they arrived as, to relay without encoding them again.
    raw_headers: tuple[tuple[bytes, bytes], ...] | None = None


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
        host = str(self._base.raw_host)
        self._host = host
        self._port = int(self._base.port or (443 if self._base.scheme == "https" else 80))
        authority = f"[{host}]" if ":" in host else host
        if self._base.explicit_port is not None and not self._base.is_default_port():
            authority += f":{self._base.explicit_port}"
        self._host_header = authority.encode("idna" if not authority.isascii() else "ascii")
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._connect_retries = connect_retries
        self._backoff = backoff
        self._pool: Pool | None = None

    @property
    def server(self) -> tuple[str, int]:
        """The upstream's host and port (``server.address`` and ``server.port`` of spans)."""
        return str(self._base.host), int(self._base.port or 0)

    async def start(self) -> None:
        self._pool = Pool(
            self._host,
            self._port,
            tls=self._base.scheme == "https",
            connect_timeout=self._connect_timeout,
        )

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.close()

    async def reachable(self) -> bool:
        """Whether a TCP connection to the upstream opens within the connect timeout.

        What ``/_payonce/health/ready?upstream=true`` checks: it sends no request,
        so it spends nothing and needs no credential.
        """
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(self._host, self._port), self._connect_timeout
            )
        except (OSError, TimeoutError):
            return False
        writer.close()
        return True

    def url_for(self, raw_path: str, query: str) -> URL:
        target = self._origin + self._prefix + raw_path + ("?" + query if query else "")
        return URL(target, encoded=True)

    async def send(
        self,
        method: str,
        raw_path: str,
        query: str,
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes,
    ) -> UpstreamResponse:
        """Forward one request and read the whole answer.

        Raises :class:`UpstreamUnavailable` or :class:`UpstreamTimeout`.
        """
        async with self.open(method, raw_path, query, headers, body) as response:
            body = await response.read()
            return UpstreamResponse(response.status, response.headers, body, response.raw_headers)

    def open(
        self,
        method: str,
        raw_path: str,
        query: str,
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes,
        *,
        on_attempt: Callable[[int], object] | None = None,
    ) -> Exchange:
        """Forward one request: ``async with`` it for the response, once its head has arrived.

        ``headers``: the client's fields as received (lowercase names), hop-by-hop
        ones already left out (:meth:`ProxiedRequest.upstream_headers`).
        ``on_attempt(n)`` is told as attempt ``n`` (1, then connect retries) is
        sent, so a call cancelled before its answer still counts its attempts.

        The body is read through the :class:`OpenResponse` the block gets. Leaving
        the block early (a cancelled relay) closes the connection, which is how an
        upstream learns that nobody is listening any more.
        """
        assert self._pool is not None, "Upstream.start() was not awaited"
        target = (self._prefix + raw_path + ("?" + query if query else "")).encode("latin-1")
        head = request_head(method, target, self._host_header, headers, body)
        return Exchange(self, self._pool, head, body, method == "HEAD", on_attempt)

    async def _connect(
        self, pool: Pool, on_attempt: Callable[[int], object] | None
    ) -> tuple[Connection, int]:
        """A connection, and the attempts it took (connect failures retried, with jitter)."""
        attempt = 0
        while True:
            if on_attempt is not None:
                on_attempt(attempt + 1)
            try:
                return await pool.acquire(), attempt + 1
            except ConnectFailed as exc:
                # Provably not sent: safe to try again, with full jitter.
                if attempt >= self._connect_retries:
                    raise UpstreamUnavailable(
                        f"cannot connect to the upstream {self._origin}: {exc}"
                    ) from exc
                await asyncio.sleep(random.uniform(0, self._backoff * 2**attempt))
                attempt += 1


class Exchange:
    """One request to the upstream, as an async context manager.

    A class, not ``contextlib.asynccontextmanager``: a generator-based one costs
    another object, two generator resumptions and their frames per call.
    """

    __slots__ = ("_body", "_connection", "_head", "_head_only", "_on_attempt", "_pool", "_upstream")

    def __init__(
        self,
        upstream: Upstream,
        pool: Pool,
        head: bytes,
        body: bytes,
        head_only: bool,
        on_attempt: Callable[[int], object] | None,
    ) -> None:
        self._upstream, self._pool = upstream, pool
        self._head, self._body, self._head_only = head, body, head_only
        self._on_attempt = on_attempt
        self._connection: Connection | None = None

    async def __aenter__(self) -> OpenResponse:
        upstream = self._upstream
        connection, attempts = await upstream._connect(self._pool, self._on_attempt)
        try:
            connection.send(self._head, self._body, self._head_only)
            await connection.read_head(upstream._read_timeout)
        except (TimeoutError, ConnectionError) as exc:
            _discard(connection)
            raise _translate(exc) from exc
        except BaseException:  # cancelled while waiting for the head
            _discard(connection)
            raise
        self._connection = connection
        return OpenResponse(connection, upstream._read_timeout, attempts=attempts)

    async def __aexit__(self, kind: type[BaseException] | None, *_: object) -> None:
        connection = self._connection
        assert connection is not None
        if kind is None and connection.complete:
            self._pool.release(connection)  # back to the keep-alive pool
        else:
            _discard(connection)


def _discard(connection: Connection) -> None:
    connection.busy = False
    connection.close()


def _translate(exc: BaseException) -> UpstreamTimeout | UpstreamUnavailable:
    if isinstance(exc, TimeoutError):
        return UpstreamTimeout(
            "the upstream did not answer in time; retry with the same Idempotency-Key"
        )
    return UpstreamUnavailable(
        "the upstream connection failed after the request was sent"
        f" ({exc.__class__.__name__}); retry with the same Idempotency-Key"
    )


class OpenResponse:
    """An upstream response whose body is still to be read; errors come out translated."""

    def __init__(self, connection: Connection, read_timeout: float, attempts: int = 1) -> None:
        self._connection = connection
        self._read_timeout = read_timeout
        self.attempts = attempts  # connections tried: 1 + connect retries
        self.status = connection.status
        kept = []
        raw = []
        content_type = None
        # What the upstream declared, for a HEAD's answer: the length a GET would have.
        self.declared_length: bytes | None = None
        for field in connection.headers:
            raw_name, raw_value = field
            lowered = raw_name.lower()
            if lowered in _NOT_RELAYED:
                if lowered == b"content-length":
                    self.declared_length = raw_value
                continue
            value = raw_value.decode("latin-1")
            if lowered == b"content-type" and content_type is None:
                content_type = value
            kept.append((raw_name.decode("latin-1"), value))
            raw.append(field)
        self.headers = tuple(kept)
        self.raw_headers = tuple(raw)  # as received: what a whole response is relayed with
        self.content_type = content_type
        # Neither a length nor chunks: the body ends when the connection does.
        self.close_delimited = connection.until_close()

    async def read(self) -> bytes:
        try:
            return await self._connection.read_all(self._read_timeout)
        except (TimeoutError, ConnectionError) as exc:
            raise _translate(exc) from exc

    async def chunks(self, take: Take | None = None) -> AsyncIterator[bytes]:
        """The body as it arrives, but for the chunks ``take`` takes as they arrive.

        ``take`` runs in the connection's callback, never while a chunk it left
        is still being handled (:meth:`Connection.read_some`); it returns False
        to leave a chunk to the loop, untouched.

        A stream whose body ends with its connection (neither a length nor chunks)
        and stops before its protocol's end event raises, as a connection that
        broke does: that framing cannot tell a crash from an end, and a cut stream
        taken as whole would be stored, replayed and billed as an answer.
        """
        connection = self._connection
        watch = self.close_delimited and is_event_stream(self.content_type)
        splitter, end = (EventSplitter(), StreamEnd()) if watch else (None, None)
        if watch:
            take = None  # every chunk is watched for the stream's end event
        while True:
            try:
                chunk = await connection.read_some(self._read_timeout, take)
            except (TimeoutError, ConnectionError) as exc:
                raise _translate(exc) from exc
            if splitter is not None and end is not None:
                for event in splitter.feed(chunk) if chunk else splitter.close():
                    end.feed(event)
                if not chunk and end.cut:
                    raise UpstreamUnavailable(
                        "the upstream closed the connection before its stream's end event"
                        " (a body delimited by the connection's end); retry with the same"
                        " Idempotency-Key"
                    )
            if not chunk:
                return
            yield chunk
