"""Auto-pipelining: the commands issued in one event-loop turn go to Redis as one pipeline.

Under load several requests reach the store in the same turn of the event loop
(their bytes arrived in the same poll), as with SQLite's group commit. redis-py
spends most of a command's cost in Python around the socket, and a pipeline
pays much of it once per batch: on this project's machine 16 ``EVALSHA`` issued
together cost 56 µs of CPU each, and 18 µs each as one pipeline.

The first command of a turn leads: it yields once (``asyncio.sleep(0)``) so the
others of the turn can join, then sends alone if nobody did (one extra loop
iteration, no other cost) or hands the batch to a task that sends it as one
non-transactional pipeline. Each command keeps its own result and its own
error; batching adds no atomicity and removes none (every command is one
script or one read). A command whose caller is cancelled after the batch was
handed over still runs, as a command already sent would.

A command no client waits on (a stream's event append: followers in this process
got the events live) can be *deferred* (:meth:`Batcher.execute_later`): it waits up
to ``DEFER`` seconds for company, as the SQLite store's deferred writes do (the
same ``group_commit.DEFER``). Events arrive spread over the turns, one or two a
turn, so without it nearly every append was a pipeline of its own, and a send to
Redis (a system call that runs loopback TCP for both ends) was a fifth of the
gateway's CPU with 2,500 streams in flight (benchmarks/NOTEBOOK.md, "Stream events
without the record's update").
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError

# One policy for writes no client waits on, whichever the store: how long one
# waits for company, and how many go at once without waiting longer.
from payonce.store.group_commit import DEFER, MAX_MERGED

__all__ = ["Batcher"]

# One command: its arguments, what to run instead on NOSCRIPT (EVAL), its result.
_Entry = tuple[tuple[Any, ...], tuple[Any, ...] | None, "asyncio.Future[Any]"]


class Batcher:
    """Runs commands through one client, pipelining those issued in the same turn."""

    def __init__(self, client: Redis | RedisCluster) -> None:
        self._client = client
        self._queue: list[_Entry] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._deferred: list[_Entry] = []
        self._later: asyncio.Handle | None = None

    async def execute(self, *args: Any, noscript: tuple[Any, ...] | None = None) -> Any:
        """Run one command; ``noscript`` is the ``EVAL`` to run if Redis lost the script."""
        if self._queue is not None:
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self._queue.append((args, noscript, future))
            return await future
        queue: list[_Entry] = []
        self._queue = queue
        try:
            await asyncio.sleep(0)
        except BaseException:  # cancelled before sending: the others still go
            self._queue = None
            if queue:
                self._spawn(queue)
            raise
        self._queue = None
        if not queue:
            return await self._one(args, noscript)
        mine: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._spawn([(args, noscript, mine), *queue])
        return await mine

    async def execute_later(self, *args: Any, noscript: tuple[Any, ...] | None = None) -> Any:
        """Run one command within ``DEFER`` seconds, in one pipeline with the others deferred.

        Queued at once: a caller cancelled meanwhile does not take it back.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._deferred.append((args, noscript, future))
        if self._later is None:
            self._later = loop.call_later(DEFER, self._send_deferred)
        if len(self._deferred) >= MAX_MERGED:
            self._later.cancel()
            self._send_deferred()
        return await future

    def _send_deferred(self) -> None:
        self._later = None
        batch, self._deferred = self._deferred, []
        if batch:
            self._spawn(batch)

    async def _one(self, args: tuple[Any, ...], noscript: tuple[Any, ...] | None) -> Any:
        try:
            return await self._client.execute_command(*args)
        except NoScriptError:
            if noscript is None:
                raise
            return await self._client.execute_command(*noscript)

    def _spawn(self, batch: list[_Entry]) -> None:
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[_Entry]) -> None:
        try:
            pipe = self._client.pipeline(transaction=False)
            for args, _, _ in batch:
                pipe.execute_command(*args)
            results = await pipe.execute(raise_on_error=False)
        except asyncio.CancelledError:
            for _, _, future in batch:
                future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - relayed to every caller, who translates it
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, noscript, future), result in zip(batch, results, strict=True):
            if isinstance(result, NoScriptError) and noscript is not None:
                try:
                    result = await self._client.execute_command(*noscript)
                except Exception as exc:  # noqa: BLE001 - relayed to the caller
                    result = exc
            if future.done():
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)

    async def close(self) -> None:
        """Send what is deferred, and wait for batches in flight (their callers wait too)."""
        if self._later is not None:
            self._later.cancel()
            self._send_deferred()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
