"""Connections waiting to be accepted are taken in batches, not one per loop turn.

libuv (under uvloop) accepts one connection per turn of the event loop; with
thousands of calls in flight a turn takes milliseconds and calls waited
100-250 ms in the kernel's accept queue (gateway/accepting.py). Here 100
connections wait before the loop runs; after a dozen turns every one must have
been accepted, and every one is answered.
"""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace
from typing import Any, cast

import uvicorn
import uvloop

from payonce.gateway.app import Gateway
from payonce.gateway.protocol import HttpLimits, protocol_class
from payonce.gateway.server import _Server
from tests.support.processes import free_port

WAITING = 100
TURNS = 12


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def _accepted_after_turns() -> tuple[int, int, int]:
    port = free_port()
    config = uvicorn.Config(
        _app,
        host="127.0.0.1",
        port=port,
        loop="none",
        lifespan="off",
        log_level="warning",
        http=protocol_class(HttpLimits()),
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
    seen = len(server.server_state.connections)
    answered = 0
    for client in clients:
        client.setblocking(False)
        await loop.sock_sendall(client, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    for client in clients:
        data = b""
        while chunk := await asyncio.wait_for(loop.sock_recv(client, 65536), 10):
            data += chunk
        answered += data.startswith(b"HTTP/1.1 200")
        client.close()
    accepted = server.acceptor.accepted
    server.should_exit = True
    await serving
    return seen, answered, accepted


def test_waiting_connections_are_accepted_within_a_few_turns() -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        seen, answered, accepted = runner.run(_accepted_after_turns())
    assert seen == WAITING, f"after {TURNS} turns only {seen} of {WAITING} connections were seen"
    assert answered == WAITING
    assert accepted > WAITING // 2  # most by the batch acceptor, the rest by libuv
