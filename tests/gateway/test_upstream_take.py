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
        # Each connection's writer once its response head is written, in order.
        self.writers: list[asyncio.StreamWriter] = []

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
        self.writers.append(writer)
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
        if chunk.startswith(b"two"):
            return False  # as a write to a slow client is refused
        taken.append(chunk)
        return True

    upstream.send(b"one")
    reading = asyncio.create_task(connection.read_some(5, take))
    await _until(lambda: taken == [b"one"])
    # "two" and "three" come in one read: offered together, left together, they
    # both go to the reader.
    upstream.send(b"two", b"three")
    assert await reading == b"twothree"
    assert taken == [b"one"]
    # While the reader has them (relaying them to the slow client), "four" arrives:
    # not taken, since the reader has not come back for more.
    upstream.send(b"four")
    await _until(lambda: connection._buffered > 0)
    assert offered == [b"one", b"twothree"], "take was offered bytes while the reader had some"
    assert await connection.read_some(5, take) == b"four"
    # The reader is back and waiting: take has the next ones again.
    upstream.send(b"five")
    upstream.send(b"six")
    upstream.send()
    assert await connection.read_some(5, take) == b""
    assert b"".join(taken) == b"onefivesix"
    assert connection.reusable
    connection.close()


async def test_the_chunks_of_one_read_are_offered_in_one_call(upstream: _Upstream) -> None:
    # A process that was off its core finds many chunks per socket: one split, one
    # push and one client write for them all, as the reader's loop did.
    connection = await _open(upstream)
    offered: list[bytes] = []

    def take(chunk: bytes) -> bool:
        offered.append(chunk)
        return True

    chunks = [b"<%d>" % n for n in range(100)]
    upstream.send(*chunks)  # one write: one read
    upstream.send()
    assert await connection.read_some(5, take) == b""
    assert offered == [b"".join(chunks)]
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


async def _waiting_connections(upstream: _Upstream, count: int) -> list[Connection]:
    pool = Pool("127.0.0.1", upstream.port, tls=False, connect_timeout=5)
    connections = [await pool.acquire() for _ in range(count)]
    for connection in connections:
        connection.send(request_head("GET", b"/stream", b"127.0.0.1", [], b""), b"", False)
    await _until(lambda: len(upstream.writers) == count)
    for connection in connections:
        await connection.read_head(5)
    return connections


class _Turns:
    """Counts the event loop's turns: a callback that schedules itself again each turn."""

    def __init__(self) -> None:
        self.now = 0
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        self.now += 1
        self._handle = self._loop.call_soon(self._tick)

    def stop(self) -> None:
        self._handle.cancel()


async def test_at_most_so_many_reads_a_turn_are_taken_and_the_rest_next_turn(
    upstream: _Upstream,
) -> None:
    # A loop with more to read than it can handle must still run its timers and
    # tasks: past TAKEN_PER_TURN reads in one turn (all the pool's connections
    # together), the rest are taken in the next turn, each from a callback of its
    # own, in line with the timers and tasks due then. Not by their readers:
    # waking a reader's task costs a future, a task step and an async generator's
    # step, and at 1,000 streams x 20 events/s half the events went that way once
    # the loop fell behind, which made it fall further (benchmarks/NOTEBOOK.md,
    # "Reads past the turn's budget").
    count = 2 * TAKEN_PER_TURN + 6
    connections = await _waiting_connections(upstream, count)
    turns = _Turns()
    taken: list[tuple[int, bytes]] = []

    def take(chunk: bytes) -> bool:
        taken.append((turns.now, chunk))
        return True

    readers = [asyncio.create_task(c.read_some(5, take)) for c in connections]
    await asyncio.sleep(0.05)  # every reader waiting
    # One chunk to every connection in one step of this loop: all of them are
    # readable at the next poll, and read in one turn.
    for n, writer in enumerate(upstream.writers):
        writer.write(b"%x\r\n<%d>\r\n" % (len(b"<%d>" % n), n))
    await _until(lambda: len(taken) == count)
    turns.stop()
    assert not any(reader.done() for reader in readers), "a reader woke for a chunk"
    first = taken[0][0]
    assert sum(1 for turn, _ in taken if turn == first) == TAKEN_PER_TURN
    assert sorted(chunk for _, chunk in taken) == sorted(b"<%d>" % n for n in range(count))
    for reader in readers:
        reader.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    for connection in connections:
        connection.close()


async def test_bytes_that_wait_for_the_next_turn_keep_their_order(upstream: _Upstream) -> None:
    # A read past the turn's budget is taken in the next turn; the connection may
    # read again meanwhile, and its reader may wake first (the body ends).
    # Either way the bytes arrive in order, once: to take in one piece, or to the
    # reader. The reads are the protocol's own callback, called here in one step of
    # the loop, as one turn's poll calls it.
    (connection,) = await _waiting_connections(upstream, 1)
    pool = connection._pool
    taken: list[bytes] = []

    def take(chunk: bytes) -> bool:
        taken.append(chunk)
        return True

    def spend_the_turn() -> None:
        # As the turn's reads would: the first schedules the count's restart.
        if pool.takes_left == TAKEN_PER_TURN:
            asyncio.get_running_loop().call_soon(pool.new_turn)
        pool.takes_left = 0

    reading = asyncio.create_task(connection.read_some(5, take))
    await asyncio.sleep(0.05)
    spend_the_turn()
    connection.data_received(b"2\r\na1\r\n")
    connection.data_received(b"2\r\nb1\r\n")
    assert taken == []
    await _until(lambda: taken == [b"a1b1"])
    assert not reading.done()
    spend_the_turn()
    # A chunk and the body's end in one read: the reader wakes, and has the chunk.
    connection.data_received(b"2\r\nc1\r\n0\r\n\r\n")
    assert await reading == b"c1"
    await asyncio.sleep(0.01)  # the next turn: nothing left for take
    assert taken == [b"a1b1"]
    assert await connection.read_some(5, take) == b""
    assert connection.reusable
    connection.close()


async def test_a_shorter_read_timeout_after_a_longer_one_is_kept(upstream: _Upstream) -> None:
    # One timer serves a connection's waits one after the other: a wait with a
    # shorter timeout than the timer's must not wait for it.
    (connection,) = await _waiting_connections(upstream, 1)
    upstream.send(b"one")
    assert await connection.read_some(60) == b"one"
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(TimeoutError):
        await connection.read_some(0.2)
    assert loop.time() - began < 30, "the 0.2 s timeout waited for the 60 s one"
    connection.close()
