"""The transport wrapper uvicorn writes through (payonce.gateway.transport) offers the
whole of asyncio's transport API: it has no ``__getattr__`` passing unknown names to
the real transport (attribute reads on such a class are never specialized, several a
streamed event), so a method missing here would be an AttributeError in a request."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from payonce.gateway.transport import Transport


class _Protocol(asyncio.Protocol):
    lingering = False

    def close_connection(self) -> None:
        pass


def test_every_transport_method_is_offered() -> None:
    public = {name for name in dir(asyncio.Transport) if not name.startswith("_")}
    offered = set(Transport.__slots__) | {
        name for name in vars(Transport) if not name.startswith("_")
    }
    assert public <= offered, sorted(public - offered)
    assert "__getattr__" not in vars(Transport)


# The gateway serves on uvloop; asyncio's own loop is the fallback.
@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_the_wrapper_delegates_to_a_real_transport(
    run: Callable[[Coroutine[Any, Any, None]], None],
) -> None:
    run(_delegates())


async def _delegates() -> None:
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    try:
        raw, protocol = await loop.connect_accepted_socket(_Protocol, ours)
        wrapper = Transport(raw, protocol, loop)
        assert wrapper.is_reading()
        wrapper.set_write_buffer_limits(high=1 << 16)
        assert wrapper.get_write_buffer_limits()[1] == 1 << 16
        assert wrapper.get_protocol() is protocol
        assert wrapper.get_extra_info("socket") is not None
        wrapper.write(b"one ")
        wrapper.write(b"turn")
        await asyncio.sleep(0)  # held to the end of the turn, then one write
        await asyncio.sleep(0.01)
        theirs.setblocking(False)
        assert theirs.recv(100) == b"one turn"
        wrapper.close()
    finally:
        theirs.close()
