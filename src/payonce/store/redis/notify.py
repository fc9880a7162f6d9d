"""Wake-ups for :meth:`RedisStore.wait` through Redis Pub/Sub, one subscription per record.

The scripts that complete, release or add events to a record publish on the
record's channel (:mod:`payonce.store.redis.keys`). A waiter subscribes to that
channel *before* it reads the record, so a change after the read always
reaches it; then it sleeps until a message, its lease check or its timeout.

One Pub/Sub connection per process (per cluster shard) carries every
subscription, read by one background task. Waiters of one record in one
process share its subscription, which lingers a few seconds after the last
one leaves: a stream follower that waits again and again subscribes once.

Why Pub/Sub and not blocking list pops: a pop wakes one waiter and holds a
connection per waiter for the whole wait, while a message reaches every
follower of a stream, on every replica, over one connection each. Measured on
this project's 2-core machine (redis-py 8.1 + hiredis, local Redis 7.0, one
process): a waiter returns a median 0.8 ms after ``complete()`` is called (that
includes the complete itself and the waiter's re-read); a ``wait()`` costs
~0.7 ms when it must subscribe (one round trip for the confirmation, one
read) and ~0.3 ms while the subscription lingers; a publish with no listener
adds nothing measurable to a script. Polling at the same latency would cost a
read per waiter per millisecond.

On a cluster, sharded Pub/Sub (``SSUBSCRIBE``, Redis 7) keeps each message on
the shard that owns the record instead of broadcasting it to every node. A
message can still be lost: the connection drops, a slot moves. Waiters
therefore re-read the record every ``poll_interval`` at the latest, and after a
reconnect every waiter is woken to re-read at once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError, SlotNotCoveredError

__all__ = ["Notifications", "Watch"]

_LOST = (RedisError, OSError)


class Watch:
    """The local waiters of one record's channel."""

    __slots__ = ("changed", "channel", "listener", "ready", "refs", "unwatch")

    def __init__(self, channel: bytes, listener: _Listener) -> None:
        loop = asyncio.get_running_loop()
        self.channel = channel
        self.listener = listener
        self.refs = 0
        self.changed: asyncio.Future[None] = loop.create_future()
        self.ready: asyncio.Future[None] = loop.create_future()
        self.unwatch: asyncio.TimerHandle | None = None

    def fire(self) -> None:
        """Wake everyone sleeping on :attr:`changed`; later sleepers get a new future."""
        changed, self.changed = self.changed, asyncio.get_running_loop().create_future()
        changed.set_result(None)

    async def sleep(self, changed: asyncio.Future[None], timeout: float) -> None:
        """Until ``changed`` (taken before the last read of the record) fires, or ``timeout``."""
        await asyncio.wait((changed,), timeout=max(0.0, timeout))


class _Listener:
    """One Pub/Sub connection, its reader task, and its (un)subscribe confirmations."""

    def __init__(self, pubsub: PubSub, *, sharded: bool, watches: dict[bytes, Watch]) -> None:
        self._pubsub = pubsub
        self._sharded = sharded
        self._kinds = ("ssubscribe", "sunsubscribe") if sharded else ("subscribe", "unsubscribe")
        self._watches = watches
        self._lock = asyncio.Lock()  # keeps sends and their expected confirmations in order
        self._pending: dict[bytes, collections.deque[tuple[str, asyncio.Future[None]]]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def subscribe(self, watch: Watch) -> None:
        async with self._lock:
            self._pending.setdefault(watch.channel, collections.deque()).append(
                (self._kinds[0], watch.ready)
            )
            try:
                if self._sharded:
                    await self._pubsub.ssubscribe(watch.channel)
                else:
                    await self._pubsub.subscribe(watch.channel)
            except BaseException:
                self._pending[watch.channel].pop()
                raise
        if self._reader is None:
            self._reader = asyncio.create_task(self._read(), name="payonce-redis-pubsub")

    async def unsubscribe(self, channel: bytes) -> None:
        async with self._lock:
            if channel in self._watches:  # watched again meanwhile: keep it
                return
            done = asyncio.get_running_loop().create_future()
            self._pending.setdefault(channel, collections.deque()).append((self._kinds[1], done))
            with contextlib.suppress(*_LOST):
                if self._sharded:
                    await self._pubsub.sunsubscribe(channel)
                else:
                    await self._pubsub.unsubscribe(channel)

    async def _read(self) -> None:
        pause, broken = 0.05, False
        while True:
            try:
                message = await self._pubsub.get_message(timeout=None)
            except _LOST:
                # Whatever was sent is lost; waiters fall back on polling.
                self._settle_pending()
                broken = True
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)
                continue
            pause = 0.05
            if broken:  # reconnected (redis-py resubscribed): messages may have been missed
                broken = False
                for watch in list(self._watches.values()):
                    if watch.listener is self:
                        watch.fire()
            if message is not None:
                self._dispatch(message)

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind, channel = message["type"], message["channel"]
        if kind in ("message", "smessage"):
            watch = self._watches.get(channel)
            if watch is not None:
                watch.fire()
        elif kind in self._kinds:
            pending = self._pending.get(channel)
            if pending and pending[0][0] == kind:  # else unsolicited (resubscribe, slot moved)
                _, future = pending.popleft()
                if not future.done():
                    future.set_result(None)
                if not pending:
                    del self._pending[channel]

    def _settle_pending(self) -> None:
        for pending in self._pending.values():
            for _, future in pending:
                if not future.done():
                    future.set_result(None)
        self._pending.clear()

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        with contextlib.suppress(*_LOST):
            # Untyped in redis-py 8.1, typed from 8.2: a cast holds for both.
            aclose = cast("Callable[[], Awaitable[None]]", self._pubsub.aclose)
            await aclose()


class Notifications:
    """Per-record wake-ups: :meth:`watch` a channel, then sleep on the :class:`Watch`."""

    def __init__(
        self,
        client: Redis | RedisCluster,
        *,
        ready_timeout: float = 1.0,
        linger: float = 5.0,
    ) -> None:
        self._client = client
        self._ready_timeout = ready_timeout
        self._linger = linger
        self._watches: dict[bytes, Watch] = {}
        self._listeners: dict[str, _Listener] = {}
        self._pools: list[ConnectionPool] = []
        self._unsubscribing: set[asyncio.Task[None]] = set()

    async def _listener(self, channel: bytes) -> _Listener:
        client = self._client
        if isinstance(client, Redis):
            name = ""
            if name not in self._listeners:
                pubsub = client.pubsub()
                self._listeners[name] = _Listener(pubsub, sharded=False, watches=self._watches)
            return self._listeners[name]
        await client.initialize()
        node = client.get_node_from_key(channel.decode())
        if node is None:
            raise SlotNotCoveredError(f"no cluster node serves {channel!r}")
        if node.name not in self._listeners:
            # A pool of its own: a subscribed connection never goes back to the node's pool.
            pool = ConnectionPool(connection_class=node.connection_class, **node.connection_kwargs)
            self._pools.append(pool)
            self._listeners[node.name] = _Listener(
                PubSub(pool), sharded=True, watches=self._watches
            )
        return self._listeners[node.name]

    @contextlib.asynccontextmanager
    async def watch(self, channel: bytes) -> AsyncIterator[Watch]:
        """Subscribe to ``channel`` (or share the subscription) and wait for it to be active.

        A subscription not confirmed within ``ready_timeout`` is used anyway:
        the caller's periodic re-read covers what it might miss.
        """
        watch = self._watches.get(channel)
        if watch is None:
            listener = await self._listener(channel)
            watch = self._watches.get(channel)  # another waiter may have come meanwhile
            if watch is None:
                watch = Watch(channel, listener)
                self._watches[channel] = watch
                try:
                    await listener.subscribe(watch)
                except BaseException:
                    del self._watches[channel]
                    if not watch.ready.done():
                        watch.ready.set_result(None)  # others sharing it poll instead
                    raise
        if watch.unwatch is not None:
            watch.unwatch.cancel()
            watch.unwatch = None
        watch.refs += 1
        try:
            if not watch.ready.done():
                await asyncio.wait((watch.ready,), timeout=self._ready_timeout)
            yield watch
        finally:
            watch.refs -= 1
            if watch.refs == 0:
                loop = asyncio.get_running_loop()
                watch.unwatch = loop.call_later(self._linger, self._forget, watch)

    def _forget(self, watch: Watch) -> None:
        if watch.refs == 0 and self._watches.get(watch.channel) is watch:
            del self._watches[watch.channel]
            task = asyncio.get_running_loop().create_task(watch.listener.unsubscribe(watch.channel))
            self._unsubscribing.add(task)
            task.add_done_callback(self._unsubscribed)

    def _unsubscribed(self, task: asyncio.Task[None]) -> None:
        self._unsubscribing.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a failed unsubscribe is not worth a log line

    async def close(self) -> None:
        for watch in self._watches.values():
            if watch.unwatch is not None:
                watch.unwatch.cancel()
        self._watches.clear()
        for task in list(self._unsubscribing):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, *_LOST):
                await task
        for listener in self._listeners.values():
            await listener.close()
        self._listeners.clear()
        for pool in self._pools:
            with contextlib.suppress(*_LOST):
                await pool.disconnect()
        self._pools.clear()
