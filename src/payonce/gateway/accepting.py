"""Accept the connections waiting on the gateway's listening sockets in batches.

libuv, under uvloop, accepts one connection per turn of the event loop (since
libuv 1.45, "unix: don't accept() connections in a loop", libuv pull request
3696), and relies on level-triggered polling to hear of the next one. With
thousands of calls in flight a turn of the gateway's loop takes milliseconds, so
it accepted at most a few hundred connections a second, whatever was waiting: in
workload 4 (5,000 calls started at 550 a second, benchmarks/NOTEBOOK.md) the accept
queue held about 100 connections near the end of the ramp, and those calls
waited 100-250 ms in the kernel before the gateway saw them. Nothing of the
gateway's saw that wait (no log, no metric, and the loop-lag probe was on time:
the loop was turning all along).

So :class:`Acceptor` watches a duplicate of each listening socket's descriptor
and, whenever it is readable, accepts up to ``BATCH`` connections and hands each
to the loop (``loop.connect_accepted_socket``) with the protocol uvicorn itself
would have made. libuv's own watcher goes on accepting its one a turn; whichever
comes first takes a connection. At the open-file limit it stops and leaves the
connection to libuv, which handles that case as before.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
from typing import Any

import uvicorn

from payonce.gateway.uvicorn_internals import listening_sockets, new_protocol

__all__ = ["BATCH", "Acceptor"]

log = logging.getLogger("payonce.gateway")

# Connections accepted per readiness of a listening socket: enough for a turn of
# a busy loop (at 550 new connections a second and 2 ms a turn, one or two wait),
# few enough that accepting them costs the turn under a millisecond.
BATCH = 32

# accept() failures after which the rest of the queue is left to libuv (it
# answers the open-file limit with its own trick) until the socket is readable again.
_STOP = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class Acceptor:
    """Accepts what waits on ``server``'s listening sockets, ``batch`` at a time (module).

    :meth:`start` once uvicorn has started listening; :meth:`stop` when it stops
    (the gateway's server does both).
    """

    def __init__(self, server: uvicorn.Server, *, batch: int = BATCH) -> None:
        self._server = server
        self._batch = batch
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listeners: list[socket.socket] = []
        self._handshakes: set[asyncio.Task[Any]] = set()
        self.accepted = 0  # connections this class accepted (libuv's own not counted)

    def start(self) -> None:
        """Watch every listening socket of the server (a duplicate descriptor of each)."""
        loop = self._loop = asyncio.get_running_loop()
        for pseudo in listening_sockets(self._server):
            listener = socket.socket(fileno=os.dup(pseudo.fileno()))
            listener.setblocking(False)
            self._listeners.append(listener)
            loop.add_reader(listener.fileno(), self._ready, listener)

    def stop(self) -> None:
        """Stop accepting (before uvicorn closes its servers); idempotent."""
        loop, listeners, self._listeners = self._loop, self._listeners, []
        for listener in listeners:
            if loop is not None:
                loop.remove_reader(listener.fileno())
            listener.close()

    def _ready(self, listener: socket.socket) -> None:
        loop = self._loop
        assert loop is not None
        ssl = self._server.config.ssl
        for _ in range(self._batch):
            try:
                connection, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return  # the queue is empty (or libuv took the last one)
            except ConnectionAbortedError:
                continue  # the client gave up while it waited: the next one
            except OSError as exc:
                if exc.errno not in _STOP:
                    log.warning("accepting a connection failed: %s", exc)
                return
            connection.setblocking(False)
            self.accepted += 1
            task = loop.create_task(
                loop.connect_accepted_socket(self._protocol, connection, ssl=ssl)
            )
            self._handshakes.add(task)
            task.add_done_callback(self._settled)

    def _protocol(self) -> asyncio.Protocol:
        return new_protocol(self._server)

    def _settled(self, task: asyncio.Task[Any]) -> None:
        self._handshakes.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            # A TLS handshake that failed, or a client that reset before it was
            # seen: nothing for the operator (uvicorn's own accept path is silent).
            log.debug("an accepted connection failed to start: %r", exc)
