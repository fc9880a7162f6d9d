"""Body bytes taken as they arrive (``Connection.read_some(take=...)``), over a real socket.

A relay that can write a chunk at once takes it in the upstream connection's
callback, without its task waking (gateway/upstream_http.py). What must hold:
the reader gets exactly the chunks ``take`` left, in order, and ``take`` is not
offered a chunk while one it left is still the reader's; what ``take`` raises
is the reader's; the read timeout still counts from the last bytes received,
taken or not. The upstream here is an asyncio server on 127.0.0.1 that writes
each chunk of a chunked response when the test says so, so nothing depends on
timing but the timeout test's own bounds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from payonce.gateway.upstream_http import TAKEN_PER_TURN, Connection, Pool, request_head


class _Upstream:
    """Answers one request with a chunked body, a chunk each time :meth:`send` is called."""

    def __init__(self) -> None:
        self.chunks: asyncio.Queue[tuple[bytes, ...] | None] = asyncio.Queue()
        self.port = 0
        self._server: asyncio.Server | None = None
        self._handlers: list[tuple[asyncio.Task[None], asyncio.StreamWriter]] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.append((task, writer))
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        while (chunks := await self.chunks.get()) is not None:
            # Chunks sent together are one write: they reach the gateway in one read.
            writer.write(b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()  # until the client closes
        writer.close()

    def send(self, *chunks: bytes) -> None:
        """Write ``chunks`` in one write; none: end the body."""
        self.chunks.put_nowait(chunks or None)

    async def close(self) -> None:
        # Nothing may outlive the test's loop: a handler still waiting for chunks
        # (the timeout test never ends its body) is cancelled, its socket closed.
        for task, writer in self._handlers:
            task.cancel()
            writer.close()
        await asyncio.gather(*(task for task, _ in self._handlers), return_exceptions=True)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


@pytest.fixture
async def upstream() -> AsyncIterator[_Upstream]:
    server = _Upstream()
    await server.start()
    yield server
    await server.close()


async def _open(upstream: _Upstream) -> Connection:
    pool = Pool("127.0.0.1", upstream.port, tls=False, connect_timeout=5)
    connection = await pool.acquire()
    connection.send(request_head("GET", b"/stream", b"127.0.0.1", [], b""), b"", False)
    await connection.read_head(5)
    return connection


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.005)


async def test_the_reader_gets_what_take_left_in_order_and_take_waits_for_it(
    upstream: _Upstream,
) -> None:
    connection = await _open(upstream)
    offered: list[bytes] = []
    taken: list[bytes] = []

    def take(chunk: bytes) -> bool:
        offered.append(chunk)
        if chunk == b"two":
            return False  # as a write to a slow client is refused
        taken.append(chunk)
        return True

    upstream.send(b"one")
    # "three" comes in the same read as "two", which take leaves: it must not be
    # taken past "two", so both go to the reader.
    upstream.send(b"two", b"three")
    assert await connection.read_some(5, take) == b"twothree"
    assert taken == [b"one"]
    # While the reader has them (relaying them to the slow client), "four" arrives:
    # not taken either, since the reader has not come back for more.
    upstream.send(b"four")
    await _until(lambda: connection._buffered > 0)
    assert offered == [b"one", b"two"], "take was offered a chunk while the reader had one"
    assert await connection.read_some(5, take) == b"four"
    # The reader is back and waiting: take has the next ones again.
    upstream.send(b"five")
    upstream.send(b"six")
    upstream.send()
    assert await connection.read_some(5, take) == b""
    assert taken == [b"one", b"five", b"six"]
    assert connection.reusable
    connection.close()


async def test_what_take_raises_is_raised_by_the_reader(upstream: _Upstream) -> None:
    connection = await _open(upstream)

    def take(chunk: bytes) -> bool:
        raise ValueError(f"cannot handle {chunk!r}")

    upstream.send(b"one")
    upstream.send()
    with pytest.raises(ValueError, match="cannot handle b'one'"):
        await connection.read_some(5, take)
    # Raised again, not skipped: the bytes it failed on are lost to the reader.
    with pytest.raises(ValueError, match="cannot handle"):
        await connection.read_some(5, take)
    assert not connection.reusable, "a connection whose bytes were lost went back to the pool"
    connection.close()


async def test_the_read_timeout_counts_from_the_last_bytes_taken(upstream: _Upstream) -> None:
    connection = await _open(upstream)
    taken: list[bytes] = []

    def take(chunk: bytes) -> bool:
        taken.append(chunk)
        return True

    async def trickle() -> None:
        for n in range(15):  # 1.4 s of chunks, each 0.1 s after the last
            upstream.send(b"%d" % n)
            await asyncio.sleep(0.1)

    loop = asyncio.get_running_loop()
    trickling = asyncio.create_task(trickle())
    began = loop.time()
    # A wait of 2.4 s, longer than the timeout, but never 1 s without bytes (a
    # machine that stalls for a second could fail this): only once they stop
    # does the read time out, a second after the last.
    with pytest.raises(TimeoutError):
        await connection.read_some(1.0, take)
    waited = loop.time() - began
    await trickling
    assert taken == [b"%d" % n for n in range(15)]
    assert waited >= 2.0, f"timed out after {waited:.2f} s, while bytes came"
    connection.close()


async def test_at_most_so_many_chunks_a_turn_are_taken_and_the_rest_wait_in_order(
    upstream: _Upstream,
) -> None:
    # A loop with more to read than it can handle must still run its timers and
    # tasks: past TAKEN_PER_TURN chunks in one turn, the rest go to their readers.
    connection = await _open(upstream)
    taken: list[bytes] = []

    def take(chunk: bytes) -> bool:
        taken.append(chunk)
        return True

    chunks = [b"<%d>" % n for n in range(TAKEN_PER_TURN + 36)]
    upstream.send(*chunks)  # one write: one read, one turn of the loop
    rest = await connection.read_some(5, take)
    assert taken == chunks[:TAKEN_PER_TURN]
    assert rest == b"".join(chunks[TAKEN_PER_TURN:])
    # The next turn's chunks are taken again.
    upstream.send(b"next")
    upstream.send()
    assert await connection.read_some(5, take) == b""
    assert taken[-1] == b"next"
    connection.close()
