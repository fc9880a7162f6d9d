"""Waking followers in other processes: ``NOTIFY``, coalesced and off the write path.

A write that changes a record (completion, release, new events, a new
stream) wakes this process's waiters at once (:class:`Waiters`) and, when a
follower in another process marked the record watched (the ``watched``
column, set before that follower reads the record), queues the record's short
name here: most records have no follower anywhere, and a NOTIFY costs every
listening backend and gateway a wake-up (measured: 100 µs of PostgreSQL's CPU
per keyed call when every completion was announced). A task sends the names queued in the last
``COALESCE`` seconds in one ``pg_notify`` on a pooled connection, after the
writes committed and outside their transactions (``NOTIFY`` inside a write
would serialise every commit on the notification queue's lock). One
connection per process, outside the pool, ``LISTEN``s and wakes the waiters
the names it receives belong to.

While the listening connection is down (the server restarted; a pooler in
transaction mode, ``?listen=off``), followers poll: :meth:`Notifier.poll_interval`
says how often.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from payonce.store.waiters import Waiters

__all__ = ["CHANNEL", "Notifier", "short_name"]

log = logging.getLogger("payonce.store")

CHANNEL = "payonce_records"
COALESCE = 0.005
# A NOTIFY payload is at most 8000 bytes; a name is 16 hex digits and a space.
_PER_NOTIFY = 400
# How long a follower sleeps between looks when no notification can come.
POLL_WITHOUT_LISTEN = 0.25
# With a listener nothing is lost: a NOTIFY that fails is sent again, and when the
# listening connection drops every waiter is woken to look. This backstop only
# bounds a wait no one can explain; the lease's end is always looked at on time.
POLL_WITH_LISTEN = 30.0
# A NOTIFY that failed (the server restarting) is sent again this much later.
_RESEND = 0.25
_RECONNECT = 1.0


def _end(lost: asyncio.Future[None], _connection: Any) -> None:
    if not lost.done():
        lost.set_result(None)


def short_name(tenant: str, key: str) -> str:
    """A record's name in notifications: 64 bits of a hash (a collision only wakes a waiter)."""
    return hashlib.blake2b(f"{tenant}\x00{key}".encode(), digest_size=8).hexdigest()


class Notifier:
    """Local wake-ups at once, remote ones through ``NOTIFY``/``LISTEN``."""

    def __init__(
        self,
        send: Callable[[str], Awaitable[None]],
        connect: Callable[[], Awaitable[Any]] | None,
        poll_interval: float | None = None,
    ) -> None:
        """``send``: runs one ``pg_notify`` with a payload; ``connect``: a new connection
        to listen on (``None``: never listen, poll); ``poll_interval``: look this often
        whatever happens (tests whose clock jumps: a lapse is then seen by a look)."""
        self._poll = poll_interval
        self.waiters = Waiters()
        self._send = send
        self._connect = connect
        self._queued: set[str] = set()
        self._sender: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._listening = False
        self._closed = False

    @property
    def poll_interval(self) -> float:
        if self._poll is not None:
            return self._poll
        return POLL_WITH_LISTEN if self._listening else POLL_WITHOUT_LISTEN

    def start(self) -> None:
        if self._connect is not None and self._listener is None:
            self._listener = asyncio.get_running_loop().create_task(self._listen())

    def changed(self, tenant: str, key: str, *, others: bool = True) -> None:
        """A record changed: wake this process's followers now, and (``others``: a
        follower elsewhere marked it watched) the other processes' soon."""
        name = short_name(tenant, key)
        self.waiters.notify(name)
        if self._closed or not others:
            return
        self._queued.add(name)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(self._flush())

    async def wait(self, tenant: str, key: str, timeout: float) -> None:
        await self.waiters.wait(short_name(tenant, key), timeout)

    async def _flush(self) -> None:
        await asyncio.sleep(COALESCE)
        while self._queued and not self._closed:
            names = list(self._queued)[:_PER_NOTIFY]
            self._queued.difference_update(names)
            try:
                await self._send(" ".join(names))
            except Exception as exc:  # noqa: BLE001 - sent again until the server is back
                log.debug("NOTIFY failed, sent again in %g s: %s", _RESEND, exc)
                self._queued.update(names)
                await asyncio.sleep(_RESEND)

    def _received(self, _connection: Any, _pid: int, _channel: str, payload: str) -> None:
        for name in payload.split():
            self.waiters.notify(name)

    async def _listen(self) -> None:
        assert self._connect is not None
        while not self._closed:
            connection = None
            try:
                connection = await self._connect()
                await connection.add_listener(CHANNEL, self._received)
                self._listening = True
                lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                connection.add_termination_listener(functools.partial(_end, lost))
                await lost
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - poll until the server is back
                log.debug("LISTEN failed (polling meanwhile): %s", exc)
            finally:
                if self._listening:
                    # Followers were sleeping long; let them look now, then poll.
                    self.waiters.notify_all()
                self._listening = False
                if connection is not None:
                    with contextlib.suppress(Exception):
                        connection.terminate()
            await asyncio.sleep(_RECONNECT)

    async def close(self) -> None:
        self._closed = True
        for task in (self._listener, self._sender):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
