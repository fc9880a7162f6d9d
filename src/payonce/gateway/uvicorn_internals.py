"""Every part of uvicorn the gateway uses beyond its documented API, named in one place.

uvicorn documents ``Config``, ``Server.serve()`` and its command line. The
gateway goes further: it subclasses uvicorn's httptools protocol to bound
request heads, bodies and slow clients (:mod:`payonce.gateway.protocol`),
builds that protocol itself for the connections it accepts in batches
(:mod:`payonce.gateway.accepting`), and overrides four methods of
``uvicorn.Server`` (:mod:`payonce.gateway.server`). None of that is promised
to stay, so:

- uvicorn's non-public module is imported here and nowhere else;
- :data:`PROTOCOL_MEMBERS`, :data:`CYCLE_MEMBERS` and :data:`SERVER_MEMBERS`
  list what the gateway reads, calls or overrides, and
  ``tests/gateway/test_uvicorn_internals.py`` checks each against the
  installed uvicorn (``make test-latest`` lifts the bound below to show what
  a newer release moved);
- ``pyproject.toml`` bounds uvicorn below the next minor release after
  :data:`CHECKED`, the releases the whole suite passed on.
"""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

if TYPE_CHECKING:
    import uvicorn

__all__ = [
    "CHECKED",
    "CYCLE_MEMBERS",
    "PROTOCOL_MEMBERS",
    "SERVER_MEMBERS",
    "HttpToolsProtocol",
    "listening_sockets",
    "new_protocol",
]

# Releases the whole suite passed on (uv.lock's, and those before it).
CHECKED = ("0.55.0",)

# HttpToolsProtocol: overridden (the parser callbacks and the connection's
# life) or read (the parser, the current request, flow control, the loop).
PROTOCOL_MEMBERS = (
    "__init__",
    "connection_made",
    "connection_lost",
    "data_received",
    "shutdown",
    "on_message_begin",
    "on_headers_complete",
    "on_message_complete",
    "_unset_keepalive_if_required",
    "parser",
    "headers",
    "url",
    "cycle",
    "flow",
    "loop",
    "logger",
    "client",
    "timeout_keep_alive",
)
# The request cycle (RequestResponseCycle) of the protocol's current request.
CYCLE_MEMBERS = (
    "chunked_encoding",
    "disconnected",
    "flow",
    "keep_alive",
    "message_event",
    "response_complete",
    "response_started",
)
# uvicorn.Server: overridden, or read to make a connection's protocol as uvicorn does.
SERVER_MEMBERS = (
    "startup",
    "shutdown",
    "handle_exit",
    "capture_signals",
    "servers",
    "server_state",
    "lifespan",
    "config",
    "started",
)


def new_protocol(server: uvicorn.Server) -> asyncio.Protocol:
    """The protocol uvicorn's own server makes for a connection (``Server.startup``)."""
    config = server.config
    protocol: asyncio.Protocol = config.http_protocol_class(  # type: ignore[call-arg]
        config=config, server_state=server.server_state, app_state=server.lifespan.state
    )
    return protocol


def listening_sockets(server: uvicorn.Server) -> list[socket.socket]:
    """The sockets ``server`` listens on, once it has started."""
    return [pseudo for listening in server.servers for pseudo in listening.sockets]
