"""The gateway's side of a client connection's socket: writes held to the end of a
loop turn, and a streamed body's chunks written straight to it.

Both are the HTTP protocol's (:mod:`payonce.gateway.protocol`), kept apart so
that module holds the request bounds and this one the writes.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from payonce.gateway.asgi import BodyWriter

__all__ = ["Lingering", "Transport", "socket_body_writer"]


class Lingering(Protocol):
    """What :class:`Transport` needs of its connection's protocol."""

    lingering: bool

    def close_connection(self) -> None: ...


class Transport:
    """The transport as uvicorn sees it: ``close()`` lingers while a request is unread,
    and the writes of one turn of the event loop go out together.

    uvicorn writes a response's head and its body with a ``write()`` each, one
    system call and one TCP segment each; here they are held until the end of the
    loop's turn (``call_soon``) and written with one ``writelines()``. Whatever
    else reaches the socket (a close, an EOF, the protocol's own refusals) sends
    what is held first (:meth:`flush`), so the order on the wire is the order of
    the writes. Everything else is the real transport's own bound method.

    Once the connection is lost it lets go of the protocol (:meth:`detach`): the
    two referring to each other made every connection cyclic garbage, there for
    the cycle collector to find with the event loop stopped.
    """

    __slots__ = (
        "_held",
        "_loop",
        "_protocol",
        "_raw",
        "abort",
        "can_write_eof",
        "get_extra_info",
        "get_protocol",
        "get_write_buffer_limits",
        "get_write_buffer_size",
        "is_reading",
        "pause_reading",
        "resume_reading",
        "set_protocol",
        "set_write_buffer_limits",
    )

    def __init__(
        self, raw: asyncio.Transport, protocol: Lingering, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._raw = raw
        self._protocol: Lingering | None = protocol
        self._loop = loop
        self._held: list[bytes] = []
        self.abort = raw.abort
        self.can_write_eof = raw.can_write_eof
        self.get_extra_info = raw.get_extra_info
        self.get_write_buffer_size = raw.get_write_buffer_size
        self.pause_reading = raw.pause_reading
        self.resume_reading = raw.resume_reading
        self.set_protocol = raw.set_protocol
        self.get_protocol = raw.get_protocol
        self.is_reading = raw.is_reading
        self.get_write_buffer_limits = raw.get_write_buffer_limits
        self.set_write_buffer_limits = raw.set_write_buffer_limits

    def write(self, data: bytes) -> None:
        held = self._held
        if not held:
            self._loop.call_soon(self.flush)
        held.append(data)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        """Write what is held, in one system call."""
        held = self._held
        if held:
            self._held = []
            if not self._raw.is_closing():
                if len(held) == 1:
                    self._raw.write(held[0])
                else:
                    self._raw.writelines(held)

    def write_eof(self) -> None:
        self.flush()
        self._raw.write_eof()

    def close(self) -> None:
        protocol = self._protocol
        if protocol is None:
            self._raw.close()
        else:
            protocol.close_connection()

    def is_closing(self) -> bool:
        protocol = self._protocol
        return (protocol is not None and protocol.lingering) or self._raw.is_closing()

    def detach(self) -> None:
        """The connection is gone: forget the protocol (the ASGI task may still hold us)."""
        self._protocol = None

    # No __getattr__ passing the rest to the real transport: a class with one has
    # every attribute read go through it unspecialized, several a streamed event
    # (benchmarks/NOTEBOOK.md, "An event's calls counted"). The methods of
    # asyncio.Transport are all here, bound above or defined.


def socket_body_writer(cycle: Any, transport: Transport) -> BodyWriter:
    """A request's :data:`~payonce.gateway.asgi.BodyWriter`: a chunk of its response's
    body written straight to the socket.

    A streamed response is most of what the gateway writes, an event at a time.
    Through ASGI each event is a message, a coroutine of uvicorn's, and a write
    held to the end of the loop's turn (:class:`Transport`); here it is one
    chunk-framed write, made only when uvicorn's ``send`` would not have waited
    either (its response started, chunked, not complete, the client still there
    and not holding up writes). Otherwise it writes nothing and says so.

    A function, not an object with ``__call__``: calling an instance goes through
    its type's call slot, a method lookup and a new argument tuple, about 600
    instructions more per streamed event (benchmarks/NOTEBOOK.md, "An event's
    calls counted").
    """

    raw = transport._raw

    def write(body: bytes) -> bool:
        # Transport.is_closing, and a write at once or after what this turn holds
        # (kept in order), spelled out: this runs once per streamed event, and
        # two calls fewer show at token rate (benchmarks/NOTEBOOK.md).
        protocol = transport._protocol
        if (
            not body
            or not cycle.response_started
            or cycle.response_complete
            or cycle.disconnected
            or cycle.flow.write_paused
            or not cycle.chunked_encoding
            or (protocol is not None and protocol.lingering)
            or raw.is_closing()
        ):
            return False
        data = b"%x\r\n%s\r\n" % (len(body), body)
        held = transport._held
        if held:
            held.append(data)  # after what this turn holds, in order
        else:
            raw.write(data)
        return True

    return write
