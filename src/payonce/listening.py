"""Listening sockets bound before anything else starts, so a port in use is one line, exit 2.

uvicorn and aiohttp bind when their server starts: by then the gateway has opened
its store and logged that it is up, and uvicorn logs the ``OSError`` and exits 3.
And a port left to a child process to bind can be taken in between by anyone,
whom the parent then cannot tell from its child: the gateway's ``--upstream sim``
once took another simulator on ``--sim-port`` for its own and forwarded to it.

So the gateway (``payonce serve``, ``--workers``, its embedded simulator) and
``payonce sim`` bind here first, and hand the bound sockets on: to uvicorn
(``Server.serve(sockets=...)``), to aiohttp (``SockSite``), to a child process
(an inherited descriptor). A failure names the flag to change.
"""

from __future__ import annotations

import errno
import os
import socket

from payonce.errors import ConfigError

__all__ = ["BACKLOG", "close_all", "listen"]

# uvicorn's default backlog, and the simulator's: a burst of thousands of
# connections (a benchmark's, a gateway's) must not overflow the accept queue.
BACKLOG = 2048


def listen(
    host: str,
    port: int,
    *,
    host_flag: str = "--host",
    port_flag: str = "--port",
    backlog: int = BACKLOG,
) -> list[socket.socket]:
    """Bind and listen on every address ``host`` resolves to, as asyncio would.

    As ``loop.create_server(host=, port=)`` does on POSIX, which the gateway and
    the simulator used before: every address of the name (``localhost`` may be
    two), ``SO_REUSEADDR``, IPv6 sockets IPv6-only. Raises :class:`ConfigError`
    naming ``port_flag`` (or ``host_flag`` when the address is not this host's).
    """
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise ConfigError(f"{host_flag}: cannot listen on {host!r}: {exc.strerror}") from None
    listeners: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            listener = socket.socket(family, kind, proto)
            listeners.append(listener)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                # Else binding "::" would take 0.0.0.0 too and the next address fail.
                listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            listener.bind(address)
            listener.listen(backlog)
    except OSError as exc:
        close_all(listeners)
        flag = host_flag if exc.errno == errno.EADDRNOTAVAIL else port_flag
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise ConfigError(f"{flag}: cannot listen on {where}: {_reason(exc)}") from None
    return listeners


def close_all(listeners: list[socket.socket]) -> None:
    for listener in listeners:
        listener.close()


def _reason(exc: OSError) -> str:
    # "address already in use", as the rest of the line is lower case.
    if exc.errno is None:
        return str(exc)
    reason = os.strerror(exc.errno)
    return reason[:1].lower() + reason[1:]
