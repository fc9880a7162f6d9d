"""HTTP/1.1 to the one upstream: a pool of keep-alive connections, responses parsed by httptools.

Why not aiohttp's ``ClientSession``: for every call it builds a ``ClientRequest``,
a ``URL``, a ``CIMultiDict`` of the headers, trace and timer contexts, a
``ClientResponse`` with its own multidict, and goes through its connector's
bookkeeping: about a third of the CPU of a keyed first call
(benchmarks/NOTEBOOK.md, "Where the keyed first call's microseconds go"). A proxy in
front of one origin needs little of it: a request written as one ``bytes`` from
the client's header fields as they arrived, and a response parsed by llhttp
(httptools, the parser uvicorn already runs for the gateway's own side).

What it keeps of aiohttp's behaviour, which the gateway relies on:

* a connect failure (refused, DNS, TLS handshake, ``connect_timeout``) raises
  :class:`ConnectFailed`: the request provably never left, so it may be retried;
* after the request was written, a lost connection or a response that is not
  HTTP/1.1 raises ``ConnectionError`` and a gap of ``read_timeout`` between two
  reads ``TimeoutError``: ambiguous, never retried here (docs/gateway.md, "Gateway retries");
* bodies are relayed as received (no decompression), chunked bodies de-chunked,
  a body without a length read to the connection's end; a HEAD response has no
  body; 1xx responses are skipped;
* a connection goes back to the pool only after its response was read to the
  end and both sides keep it alive; one idle for ``keepalive`` seconds is closed.
  No cookies, no redirects, no headers of its own but ``Host`` and ``Content-Length``.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import Callable, Iterable

import httptools

__all__ = ["MAX_IDLE", "ConnectFailed", "Connection", "Pool", "Take"]

# Takes body bytes as they arrive, in the connection's callback (:meth:`Connection.read_some`);
# False leaves them, untouched, to the reader.
Take = Callable[[bytes], bool]

# Body bytes held for a slow reader before the connection stops reading.
_HIGH_WATER = 256 * 1024
# Idle keep-alive connections kept per upstream host: a burst of thousands of calls
# must not leave thousands of sockets open (and as many held by the upstream)
# until the next request trims them. Beyond it, the longest idle is closed.
MAX_IDLE = 100
# A response head larger than this is not an upstream's (aiohttp refuses lines
# over 8 KiB); the connection is dropped as broken.
_MAX_HEAD_BYTES = 256 * 1024
_BODILESS_STATUSES = (204, 304)
# Reads taken in connections' callbacks per turn of the event loop (all the
# pool's connections together). A loop with more to read than it can handle runs
# its I/O callbacks back to back (libuv polls again at once while its poll returns
# a full batch): relaying every chunk there starved the timers and tasks queued
# behind them, and at 1,000 streams x 20 events/s on one core, saturated either
# way, the p99 gap between a stream's events was 1.2-1.5 s instead of 0.4
# (benchmarks/NOTEBOOK.md, "Streams: the event's path in the upstream's
# callback"). Past it, a read is offered to ``take`` from a callback of its own
# in the next turn, in line with the timers and tasks due then, as its reader's
# task would have been; not through the reader: a reader woken costs a future,
# a timer check, a task step and an async generator's step, and once the loop
# fell behind half the events of 1,000 keyed streams went that way, which made
# it fall further (benchmarks/NOTEBOOK.md, "Reads past the turn's budget").
TAKEN_PER_TURN = 64


class ConnectFailed(ConnectionError):
    """No connection could be made: nothing was sent (safe to retry)."""


class Connection(asyncio.Protocol):
    """One connection to the upstream; one request at a time, its response parsed as it comes."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.busy = False  # a request was written and its connection not yet released
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        # The read timeout's timer, kept from one wait to the next (a timer per
        # wait was one per relayed event whenever the reader woke for each):
        # when it fires it looks at the wait of the moment (_time_out).
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = 0.0  # when the timer fires
        self._timeout = 0.0  # the current wait's
        # When the current wait began, or ``take`` last took bytes during it: the
        # read timeout counts from the later of the two.
        self._mark = 0.0
        self._paused = False
        self._begin(False)

    def _begin(self, head_only: bool) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.complete = False
        self.error: BaseException | None = None
        self._head_only = head_only
        self._keep_alive = False  # what llhttp said as the message completed
        self._head_bytes = 0
        self._body: list[bytes] = []
        self._buffered = 0
        self._take: Take | None = None
        # The body bytes of the read being parsed, while ``take`` waits for them.
        self._gathered: list[bytes] | None = None
        self.take_error: Exception | None = None

    # -- the request -----------------------------------------------------------------------

    def send(self, head: bytes, body: bytes, head_only: bool) -> None:
        """Write one request (``head`` ends with the blank line); its response is parsed next."""
        self._begin(head_only)
        self.busy = True
        assert self.transport is not None
        if body:
            self.transport.writelines((head, body))
        else:
            self.transport.write(head)

    async def read_head(self, timeout: float) -> None:
        """Wait for the response's status line and header fields."""
        while not self.head_done:
            await self._wait(timeout)

    def take_body(self) -> bytes:
        """The body bytes received and not yet taken."""
        body = self._body
        data = body[0] if len(body) == 1 else b"".join(body)
        self._body = []
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    async def read_some(self, timeout: float, take: Take | None = None) -> bytes:
        """What arrives of the body next; ``b""`` once it is complete.

        With ``take``, the bytes that arrive while this waits are offered to it
        first, in the connection's own callback, and what it takes is not
        returned: a relay that can write a chunk at once does so without this
        task waking (a future, a timer, a task step and an async generator's
        step per chunk, at token rate most of an unkeyed event's cost). The body
        bytes of one socket read are offered together, in one call. ``take``
        is offered bytes only while nothing waits for this reader, and not
        again, once it has left some, until this reader has them: the order of
        the bytes is kept. What ``take`` raises is raised here, and ends the
        connection's reuse.
        """
        while not self._body:
            if self.take_error is not None:
                raise self.take_error
            if self.complete:
                return b""
            self._take = take
            try:
                await self._wait(timeout)
            finally:
                self._take = None
        return self.take_body()

    async def read_all(self, timeout: float) -> bytes:
        """The rest of the body, taken as it comes.

        Taken, not left to wait for the end: past ``_HIGH_WATER`` untaken bytes
        the connection stops reading, and a body larger than that would never
        end (both sides waiting until the read timeout, the retry billed again).
        ``timeout`` is still the longest gap between two reads.
        """
        parts: list[bytes] = []
        while not self.complete:
            if self._buffered > _HIGH_WATER:
                parts.append(self.take_body())  # and reading resumes
            await self._wait(timeout)
        parts.append(self.take_body())
        return parts[0] if len(parts) == 1 else b"".join(parts)

    @property
    def reusable(self) -> bool:
        return (
            self.complete
            and self.error is None
            and self.take_error is None
            and not self.lost
            and not self._head_only
            and self._keep_alive
        )

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def _wait(self, timeout: float) -> None:
        if self.error is not None:
            raise self.error
        loop = self._loop
        waiter = self._waiter = loop.create_future()
        now = self._mark = loop.time()
        self._timeout = timeout
        if self._timer is None or self._deadline > now + timeout:
            self._arm(now + timeout)
        try:
            await waiter
        finally:
            self._waiter = None
        if self.error is not None:
            raise self.error

    def _arm(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._deadline = deadline
        self._timer = self._loop.call_at(deadline, self._time_out)

    def _disarm(self) -> None:
        """No read is waiting for a while (the connection is idle, or gone)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _time_out(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # no wait now: the next one arms the timer again
        # One timer for many waits and the chunks taken during them: moved on
        # when it fires early.
        deadline = self._mark + self._timeout
        if deadline > self._loop.time():
            self._arm(deadline)
            return
        waiter.set_exception(TimeoutError("the upstream sent nothing within the read timeout"))

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self.error is None and not self.complete:
            self.error = error
        self._wake()

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if not self.busy:  # bytes that answer no request: nothing can follow them
            self.lost = True
            self.close()
            return
        if not self.head_done:
            self._head_bytes += len(data)
            if self._head_bytes > _MAX_HEAD_BYTES:
                self._fail(ConnectionError("the upstream's response head is too large"))
                self.close()
                return
        take = self._take
        if take is not None:
            # The read's body bytes are gathered and offered to ``take`` once, after
            # the parser: a read holding many chunks (a process that was off its
            # core finds several per socket) is one split, one push, one client
            # write, as the reader's loop made it, not one of each per chunk.
            self._gathered = []
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            # Bytes with no request outstanding land here too (a reply to nothing).
            # The body bytes before the error are the reader's, or ``take``'s, first.
            self._offer(take)
            self._fail(ConnectionError(f"the upstream's response is not valid HTTP/1.1: {exc}"))
            self.close()
            return
        self._offer(take)

    def _offer(self, take: Take | None, counted: bool = True) -> None:
        gathered = self._gathered
        if take is None or gathered is None:
            return
        self._gathered = None
        if not gathered:
            return
        body = gathered[0] if len(gathered) == 1 else b"".join(gathered)
        if self._take is take:
            # While ``take`` waits, _body holds only bytes a turn's budget held back
            # for _offer_held (the reader is offered take only with none left).
            if self._body:
                self._hold(body)  # behind them
                return
            if counted:
                # The turn's budget, counted in line: this runs once per relayed event.
                pool = self._pool
                left = pool.takes_left
                if left == TAKEN_PER_TURN:  # the turn's first: the count starts over after it
                    self._loop.call_soon(pool.new_turn)
                elif left == 0:
                    self._hold(body)
                    self._loop.call_soon(self._offer_held)
                    return
                pool.takes_left = left - 1
            self._mark = self._loop.time()
            try:
                if take(body):
                    return
            except Exception as exc:  # noqa: BLE001 - raised by the reader, as if it read them
                self.take_error = exc
                self._take = None
                self._wake()
                return
        self._take = None  # the reader has these first, then the next
        self._keep(body)

    def _offer_held(self) -> None:
        """The next turn: the bytes a turn's budget held back go to ``take`` now."""
        take = self._take
        if take is not None and self._body:  # else the reader woke meanwhile and has them
            self._gathered = [self.take_body()]
            self._offer(take, counted=False)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._disarm()
        self._pool.forget(self)
        if self.head_done and not self.complete and self.until_close():
            self.complete = True  # a body delimited by the end of the connection
        self._fail(ConnectionResetError("the upstream closed the connection"))

    def pause_writing(self) -> None:
        pass  # requests are small, and written whole

    def resume_writing(self) -> None:
        pass

    # -- httptools callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.headers = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 200:
            return  # 100 Continue and the like: the answer follows
        self.status = status
        self.head_done = True
        if self._head_only:
            self.complete = True  # a HEAD response has no body, whatever it declares
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self._head_only:
            return
        gathered = self._gathered
        if gathered is not None:  # a read offered to ``take`` once parsed
            gathered.append(body)
            return
        self._keep(body)

    def _keep(self, body: bytes) -> None:
        """Hold ``body`` for the reader."""
        self._hold(body)
        self._wake()

    def _hold(self, body: bytes) -> None:
        self._body.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self.head_done:
            # Asked now: llhttp forgets the message's flags once it has ended.
            self._keep_alive = self._parser.should_keep_alive()
            self.complete = True
            self._wake()

    def until_close(self) -> bool:
        """Whether the response's body ends when the connection does (no length, no chunks)."""
        if self.status in _BODILESS_STATUSES:
            return False
        names = {name.lower() for name, _ in self.headers}
        return b"content-length" not in names and b"transfer-encoding" not in names


class Pool:
    """Idle keep-alive connections to one host, most recently used first."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls: bool,
        connect_timeout: float,
        keepalive: float = 15.0,
    ) -> None:
        self.host, self.port = host, port
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if tls else None
        self._connect_timeout = connect_timeout
        self._keepalive = keepalive
        self._idle: collections.deque[Connection] = collections.deque()
        self.loop = asyncio.get_running_loop()
        # Reads its connections may still offer to their ``take`` this turn
        # (Connection._offer counts them down; new_turn, called soon after the
        # turn's first, starts the count over).
        self.takes_left = TAKEN_PER_TURN

    def new_turn(self) -> None:
        """Start the turn's count over: called soon after the turn's first offered read."""
        self.takes_left = TAKEN_PER_TURN

    async def acquire(self) -> Connection:
        """An idle connection, or a new one (:class:`ConnectFailed` if none can be made)."""
        idle = self._idle
        while idle:
            connection = idle.pop()
            if not connection.lost:
                return connection
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, protocol = await self.loop.create_connection(
                    lambda: Connection(self),
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl is not None else None,
                )
        except TimeoutError as exc:
            raise ConnectFailed(f"connect timeout ({self._connect_timeout:g}s)") from exc
        except OSError as exc:  # refused, unreachable, DNS, TLS handshake
            raise ConnectFailed(str(exc) or exc.__class__.__name__) from exc
        return protocol

    def release(self, connection: Connection) -> None:
        """Back to the pool if it can carry another request, else closed."""
        connection.busy = False
        connection._disarm()
        if not connection.reusable:
            connection.close()
            return
        now = self.loop.time()
        connection.idle_since = now
        idle = self._idle
        if len(idle) >= MAX_IDLE:
            idle.popleft().close()
        idle.append(connection)
        # The oldest are at the front: close those idle too long.
        while idle[0].idle_since < now - self._keepalive:
            idle.popleft().close()

    def forget(self, connection: Connection) -> None:
        if connection in self._idle:
            self._idle.remove(connection)

    def close(self) -> None:
        idle, self._idle = self._idle, collections.deque()
        for connection in idle:
            connection.close()


def request_head(
    method: str, target: bytes, host: bytes, headers: Iterable[tuple[bytes, bytes]], body: bytes
) -> bytes:
    """The request line and header fields, ``Host`` first and ``Content-Length`` last."""
    parts = [method.encode("ascii"), b" ", target, b" HTTP/1.1\r\nhost: ", host, b"\r\n"]
    for name, value in headers:
        parts += (name, b": ", value, b"\r\n")
    if body or method not in ("GET", "HEAD", "OPTIONS", "DELETE", "TRACE"):
        parts.append(b"content-length: %d\r\n" % len(body))
    parts.append(b"\r\n")
    return b"".join(parts)
