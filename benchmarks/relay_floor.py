"""The floor under any Python gateway's cost per streamed event: a TCP relay on uvloop.

Each client connection gets its own connection to the upstream, and the bytes
go through untouched both ways: no HTTP parsing, no framing, no task, one
``data_received`` and one ``write`` per read, which is what every event of a
stream at token rate costs an asyncio server at the least. ``benchmarks/peers.py``
runs it as the system ``python-relay`` in workload 5 beside nginx, so the CPU a
Python gateway cannot avoid per event is measured in the same rounds as the
gateway's (benchmarks/NOTEBOOK.md, "The floor of a Python relay")::

    python benchmarks/relay_floor.py --port 8081 --upstream http://127.0.0.1:8080

With ``--http`` the upstream's responses are parsed (httptools, as the gateway
parses them) and each body chunk is written to the client framed again as a
chunk of its own, the head rebuilt: the least an HTTP proxy written in Python
does per event, without anything a gateway adds (no task, no checks, no
numbering). ``benchmarks/peers.py`` runs it as ``python-http-relay``::

    python benchmarks/relay_floor.py --port 8082 --upstream http://127.0.0.1:8080 --http

Requests go through untouched either way, and each client connection keeps one
upstream connection, so a client's keep-alive requests are answered in order.

Not a product: nothing is bounded, nothing logged. It stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import cast
from urllib.parse import urlsplit

import httptools
import uvloop


class _Side(asyncio.Protocol):
    """One end of a relayed connection: what it reads, the other end writes."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.pending: list[bytes] = []  # read before the peer was connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.write(data)
        else:
            self.pending.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.close()


class _ParsingSide(_Side):
    """The upstream end with ``--http``: responses parsed, bodies framed again."""

    def __init__(self) -> None:
        super().__init__()
        self._parser = httptools.HttpResponseParser(self)
        self._head: list[bytes] = []

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def _write(self, data: bytes) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.write(data)

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._head = []

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() not in (b"content-length", b"transfer-encoding", b"connection"):
            self._head += (name, b": ", value, b"\r\n")

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        self._write(
            b"HTTP/1.1 %d OK\r\n%stransfer-encoding: chunked\r\n\r\n"
            % (status, b"".join(self._head))
        )

    def on_body(self, body: bytes) -> None:
        self._write(b"%x\r\n%s\r\n" % (len(body), body))

    def on_message_complete(self) -> None:
        self._write(b"0\r\n\r\n")


async def _serve(port: int, upstream: str, http: bool = False) -> None:
    loop = asyncio.get_running_loop()
    target = urlsplit(upstream)
    host, upstream_port = target.hostname or "127.0.0.1", target.port or 80

    connecting: set[asyncio.Task[None]] = set()  # held: the loop keeps only weak references

    def client_side() -> _Side:
        side = _Side()

        async def connect() -> None:
            try:
                _, far = await loop.create_connection(
                    _ParsingSide if http else _Side, host, upstream_port
                )
            except OSError:
                if side.transport is not None:
                    side.transport.close()
                return
            side.peer, far.peer = far, side
            assert far.transport is not None
            for data in side.pending:
                far.transport.write(data)
            side.pending.clear()

        task = loop.create_task(connect())
        connecting.add(task)
        task.add_done_callback(connecting.discard)
        return side

    server = await loop.create_server(client_side, "127.0.0.1", port, backlog=4096)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="http://host:port")
    parser.add_argument(
        "--http", action="store_true", help="parse responses and frame their chunks again"
    )
    args = parser.parse_args()
    uvloop.run(_serve(args.port, args.upstream, args.http))


if __name__ == "__main__":
    main()
