"""Connections waiting to be accepted are taken in batches, not one per loop turn.

libuv (under uvloop) accepts one connection per turn of the event loop; with
thousands of calls in flight a turn takes milliseconds and calls waited
100-250 ms in the kernel's accept queue (gateway/accepting.py). Here 100
connections wait before the loop runs; after a dozen turns every one must have
been accepted, and every one is answered; over TLS too, where the handshake
runs after the batch acceptor has taken the connection.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import uvicorn
import uvloop

from payonce.gateway.app import Gateway
from payonce.gateway.protocol import HttpLimits, protocol_class
from payonce.gateway.server import _Server
from tests.support.processes import free_port
from tests.support.tls import Certificates, make_certificates

WAITING = 100
TURNS = 12


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def _accepted_after_turns(tls: Certificates | None = None) -> tuple[int, int, int]:
    """Connections accepted after ``TURNS`` turns, answered, and taken by the batch acceptor."""
    port = free_port()
    files = {"ssl_certfile": str(tls.cert), "ssl_keyfile": str(tls.key)} if tls else {}
    config = uvicorn.Config(
        _app,
        host="127.0.0.1",
        port=port,
        loop="none",
        lifespan="off",
        log_level="warning",
        http=protocol_class(HttpLimits()),
        **files,  # type: ignore[arg-type]
    )
    server = _Server(config, cast(Gateway, SimpleNamespace(stopping=False)))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    # Connected in the kernel while the loop does not run: all wait to be accepted.
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(WAITING)]
    loop = asyncio.get_running_loop()
    turns = asyncio.Event()
    count = 0

    def turn() -> None:
        nonlocal count
        count += 1
        if count < TURNS:
            loop.call_soon(turn)
        else:
            turns.set()

    loop.call_soon(turn)
    await turns.wait()
    seen = WAITING - _accept_queue(server)
    context = tls.client_context() if tls else None
    answers = await asyncio.gather(*(_ask(client, context) for client in clients))
    answered = sum(answer.startswith(b"HTTP/1.1 200") for answer in answers)
    accepted = server.acceptor.accepted
    server.should_exit = True
    await serving
    return seen, answered, accepted


def _accept_queue(server: _Server) -> int:
    """Connections in the kernel's accept queue of ``server``'s listening socket.

    Linux's ``TCP_INFO`` on a listening socket gives it as ``tcpi_unacked``: under TLS
    uvicorn counts a connection only after its handshake, which needs the client.
    """
    (listener,) = server.servers[0].sockets
    info = listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return int(struct.unpack_from("8B5I", info)[12])


async def _ask(client: socket.socket, context: ssl.SSLContext | None) -> bytes:
    client.setblocking(False)
    reader, writer = await asyncio.open_connection(
        sock=client, ssl=context, server_hostname="127.0.0.1" if context else None
    )
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    try:
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


def test_waiting_connections_are_accepted_within_a_few_turns() -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        seen, answered, accepted = runner.run(_accepted_after_turns())
    assert seen == WAITING, (
        f"after {TURNS} turns only {seen} of {WAITING} connections were accepted"
    )
    assert answered == WAITING
    assert accepted > WAITING // 2  # most by the batch acceptor, the rest by libuv


def test_waiting_tls_connections_are_accepted_and_answered(tmp_path: Path) -> None:
    tls = make_certificates(tmp_path)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        seen, answered, accepted = runner.run(_accepted_after_turns(tls))
    assert seen == WAITING, f"after {TURNS} turns only {seen} of {WAITING} were accepted"
    assert answered == WAITING  # every handshake done on a connection the acceptor took
    assert accepted > WAITING // 2
