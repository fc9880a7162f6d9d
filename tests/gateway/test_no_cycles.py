"""A closed client connection leaves nothing for the cycle collector.

With thousands of calls in flight, every object that can only be freed by the
cycle collector is one more it must traverse, with the event loop stopped, in
every full collection (benchmarks/NOTEBOOK.md, "The cycle collector"). The gateway's
protocol and its transport wrapper referred to each other, so each connection's
protocol, transports, uvicorn cycle and flow control outlived it as garbage.

In process: uvicorn with the gateway's protocol class on a free port (on uvloop,
as the gateway runs, and on asyncio's own loop), real TCP clients (asyncio
streams), then a collection with ``gc.DEBUG_SAVEALL``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import warnings
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
import uvloop

from payonce.gateway.protocol import GatewayProtocol, HttpLimits, protocol_class
from tests.support.processes import free_port


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"x", b"y")]})
    await send({"type": "http.response.body", "body": b"hello"})


@contextlib.asynccontextmanager
async def _server() -> AsyncIterator[tuple[int, uvicorn.Server]]:
    port = free_port()
    config = uvicorn.Config(
        _app,
        host="127.0.0.1",
        port=port,
        http=protocol_class(HttpLimits()),
        ws="none",
        lifespan="off",
        access_log=False,
        log_level="warning",
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield port, server
    finally:
        server.should_exit = True
        await task


async def _request(port: int, *, keep_alive: bool) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    connection = b"keep-alive" if keep_alive else b"close"
    writer.write(b"POST /v1/x HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nConnection: ")
    writer.write(connection + b"\r\n\r\n{}")
    answer = await reader.readuntil(b"hello")
    writer.close()
    await writer.wait_closed()
    return answer


def _garbage_protocols() -> list[object]:
    """What a full collection finds only through cycles, among the gateway's protocol objects."""
    flags = gc.get_debug()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        # The first collection also frees what earlier tests in this worker left
        # behind; a socket among them warns (CI once saw an unrelated client's),
        # and a warning from its finalizer would fail this test, not that one.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
        return [obj for obj in gc.garbage if isinstance(obj, GatewayProtocol)]
    finally:
        gc.set_debug(flags)
        gc.garbage.clear()


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_closed_connection_leaves_no_protocol_to_the_cycle_collector(loop: str) -> None:
    factory = uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(_closed_connections())


async def _closed_connections() -> None:
    async with _server() as (port, server):
        _garbage_protocols()  # what came before this test
        for number in range(20):
            answer = await _request(port, keep_alive=number % 2 == 0)
            assert answer.startswith(b"HTTP/1.1 200")
        # The server sees each close a loop turn or two after the client.
        for _ in range(250):
            if not server.server_state.connections:
                break
            await asyncio.sleep(0.02)
        assert not server.server_state.connections
        await asyncio.sleep(0.05)  # the ASGI tasks' last steps
        assert _garbage_protocols() == []
