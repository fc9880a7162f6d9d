"""What the simulator writes to the connection: JSON answers, paced events, dropped connections.

Faults are played on the transport itself: a dropped answer closes the connection
before anything is written, a dying stream closes it after the events sent so far.
aiohttp then fails to write the rest, which it treats as an ordinary client
disconnect (no traceback in the log).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from payonce.sim.provider_errors import Api

__all__ = [
    "ANTHROPIC_REQUEST_ID_HEADER",
    "EVENT_STREAM",
    "REQUEST_ID_HEADER",
    "EventSender",
    "client_connected",
    "drop_connection",
    "hide_request_id",
    "json_response",
]

REQUEST_ID_HEADER = "x-request-id"
# The Anthropic SDK reads its request id from ``request-id``; send both there.
ANTHROPIC_REQUEST_ID_HEADER = "request-id"
EVENT_STREAM = "text/event-stream"
_JSON = "application/json"
# Unpaced events are written in batches of about this many bytes, not one by one.
_WRITE_BATCH_BYTES = 64 * 1024
# --wire ...,trickle: a body that arrives a few bytes at a time, as over a slow link.
_TRICKLE_BYTES = 7
_TRICKLE_SECONDS = 0.001


def client_connected(request: web.Request) -> bool:
    # aiohttp drops the transport when the peer closes (connection_lost); a transport
    # that is closing is as good as gone for answering.
    transport = request.transport
    return transport is not None and not transport.is_closing()


class EventSender:
    """Writes a stream's events, batched when unpaced, and notes when the client has gone.

    A failed write (the client left) marks the client gone and turns later writes into
    no-ops, so the caller goes on generating and billing as if nothing happened.

    ``framing`` is how the body is delimited: ``"chunked"`` (aiohttp's own),
    ``"length"`` (the whole stream gathered, then sent with a ``Content-Length``; a
    stream that dies or drops closes the connection before any of it) or
    ``"close"`` (no length, no chunks: the head is written straight to the
    transport and the body ends when the connection closes, as HTTP/1.0 servers
    and some proxies do). ``trickle`` cuts every write into 7-byte pieces 1 ms apart.
    """

    def __init__(
        self,
        request: web.Request,
        response: web.StreamResponse,
        *,
        trickle: bool = False,
        framing: str = "chunked",
    ) -> None:
        self._request = request
        self._response = response
        self._trickle = trickle
        self._framing = framing
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._whole: list[bytes] = []  # framing "length": the body so far
        self.connected = True

    async def start(self) -> None:
        """Send the status line and headers (so ``X-Sim-Die-After: 0`` is a 200, then nothing)."""
        if self._framing == "length":
            return  # the head goes with the whole body, once its length is known
        if self._framing == "close":
            head = [b"HTTP/1.1 200 OK", b"Connection: close"]
            headers = self._response.headers.items()
            head += [b"%s: %s" % (name.encode(), value.encode()) for name, value in headers]
            await self._write(b"\r\n".join(head) + b"\r\n\r\n")
            return
        try:
            await self._response.prepare(self._request)
        except ConnectionError:
            self.connected = False

    async def send(self, event: bytes) -> None:
        """Queue one event; write the queue once it is a batch."""
        if not self.connected:
            return
        self._pending.append(event)
        self._pending_bytes += len(event)
        if self._pending_bytes >= _WRITE_BATCH_BYTES:
            await self.flush()

    async def flush(self) -> None:
        """Write what is queued, if the client is still there."""
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        if not self.connected:
            return
        if self._framing == "length":
            self._whole.append(data)
            return
        await self._write(data)

    async def finish(self) -> None:
        """The stream's end: write what is queued and end the body as its framing does."""
        await self.flush()
        if self._framing == "length" and self.connected:
            body = b"".join(self._whole)
            self._response.content_length = len(body)
            try:
                await self._response.prepare(self._request)
            except ConnectionError:
                self.connected = False
            await self._write(body)
        elif self._framing == "close":
            self._close_transport()

    async def close(self) -> None:
        """Write what is queued, then close the connection without ending the stream."""
        if self._framing != "length":
            await self.flush()
        self._close_transport()

    async def _write(self, data: bytes) -> None:
        if not self.connected:
            return
        try:
            for start in range(0, len(data), _TRICKLE_BYTES if self._trickle else len(data) or 1):
                piece = data[start : start + _TRICKLE_BYTES] if self._trickle else data
                if self._framing == "close":
                    transport = self._request.transport
                    if transport is None or transport.is_closing():
                        raise ConnectionResetError
                    transport.write(piece)
                    await asyncio.sleep(0)
                else:
                    await self._response.write(piece)
                if self._trickle:
                    await asyncio.sleep(_TRICKLE_SECONDS)
        except ConnectionError:  # aiohttp's ClientConnectionResetError among them
            self.connected = False

    def _close_transport(self) -> None:
        transport = self._request.transport
        if transport is not None:
            # close(), not abort(): the events already written reach the client first.
            # aiohttp then fails to write the end of the body (or, framed "close", the
            # response the handler returns), which it treats as an ordinary client
            # disconnect (no traceback in the log).
            transport.close()


def drop_connection(request: web.Request) -> web.Response:
    transport = request.transport
    if transport is not None:
        transport.close()
    # aiohttp then fails to write this response to the closed transport, which it
    # treats as an ordinary client disconnect: no response, no traceback in the log.
    return web.Response(status=204)


def hide_request_id(response: web.StreamResponse) -> None:
    """Like llama.cpp's server: the id is in the body only (``X-Sim-No-Request-Id``)."""
    response.headers.popall(REQUEST_ID_HEADER, None)
    response.headers.popall(ANTHROPIC_REQUEST_ID_HEADER, None)


def json_response(body: bytes, status: int, api: Api, request_id: str) -> web.Response:
    response = web.Response(body=body, status=status, content_type=_JSON)
    response.headers[REQUEST_ID_HEADER] = request_id
    if api is Api.ANTHROPIC:
        response.headers[ANTHROPIC_REQUEST_ID_HEADER] = request_id
    return response
