"""Group statements: the claims (or completions) that arrive together go in one.

A statement costs two processes a round trip: on the project's machine the
write that wakes a PostgreSQL backend is most of the gateway's CPU for a
statement (py-spy: 26% of a keyed first call's CPU in ``write``), and the
backend commits, and flushes its WAL, once per statement. As SQLite's group
commit does (store/group_commit.py), a :class:`StatementBatcher` sends the first
item at once and, while that statement runs, queues those that follow; the
queue goes as the next statement, one row per item (``unnest`` of arrays). At
one request at a time nothing waits longer than before; under load a
statement carries many.

Each item is still its own fenced write: the statement checks every row's
token and says which rows it changed, so batching adds no atomicity between
items and removes none. Two items on one record never share a statement (the
later waits for the next): ``INSERT … ON CONFLICT DO UPDATE`` refuses to touch
a row twice. Items go sorted by record, so two replicas' statements lock rows
in one order; a deadlock PostgreSQL still reports (a claim meeting a
completion) rolls the statement back and it is sent again.

A caller cancelled after its item was sent cannot unsend it: the batcher hands
the result to ``orphaned`` (a claim won for nobody is released at once rather
than left to its lease).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["MAX_BYTES", "MAX_ITEMS", "StatementBatcher"]

log = logging.getLogger("payonce.store")

Item = TypeVar("Item")
Result = TypeVar("Result")

# Bounds of one statement: rows, and bytes of the values that can be large
# (answers: a completion of a 30 MB body goes alone).
MAX_ITEMS = 256
MAX_BYTES = 4 << 20
# Attempts of a statement PostgreSQL rolled back as a deadlock victim.
_DEADLOCK_ATTEMPTS = 3


class StatementBatcher(Generic[Item, Result]):
    """Items submitted while a statement runs go together in the next."""

    def __init__(
        self,
        run: Callable[[Sequence[Item]], Awaitable[Sequence[Result]]],
        *,
        record: Callable[[Item], tuple[str, str]],
        size: Callable[[Item], int] = lambda _: 0,
        retry_if: Callable[[BaseException], bool] = lambda _: False,
        orphaned: Callable[[Item, Result], None] | None = None,
    ) -> None:
        """``run`` sends items (sorted by ``record``) as one statement and returns one
        result per item, in order; ``record``: the (tenant, key) an item writes;
        ``retry_if``: an error after which it is sent again (a deadlock victim's
        statement changed nothing)."""
        self._run = run
        self._record = record
        self._size = size
        self._retry_if = retry_if
        self._orphaned = orphaned
        self._pending: collections.deque[tuple[Item, asyncio.Future[Result]]] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self.statements = 0  # sent, for tests and benchmarks: items / statements
        self.items = 0

    async def submit(self, item: Item) -> Result:
        """Send ``item`` with whatever else is waiting; its result (or the error)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        self._pending.append((item, future))
        if self._task is None:
            self._task = loop.create_task(self._drain(), name="payonce-pg-batch")
        return await future

    def _next(self) -> list[tuple[Item, asyncio.Future[Result]]]:
        """The next statement's items, in queue order, within the bounds."""
        batch: list[tuple[Item, asyncio.Future[Result]]] = []
        later: list[tuple[Item, asyncio.Future[Result]]] = []
        records: set[tuple[str, str]] = set()
        total = 0
        while self._pending and len(batch) < MAX_ITEMS:
            item, future = self._pending.popleft()
            if future.done():  # cancelled before it was sent: nothing to undo
                continue
            record = self._record(item)
            if record in records:
                later.append((item, future))
                continue
            size = self._size(item)
            if batch and total + size > MAX_BYTES:
                self._pending.appendleft((item, future))
                break
            batch.append((item, future))
            records.add(record)
            total += size
        self._pending.extendleft(reversed(later))
        return batch

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch = self._next()
                if not batch:
                    continue
                batch.sort(key=lambda pair: self._record(pair[0]))
                items = [item for item, _ in batch]
                try:
                    results = await self._send(items)
                except Exception as exc:  # noqa: BLE001 - each caller gets it, whatever it is
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                except BaseException:  # this task cancelled (the store closing)
                    for _, future in batch:
                        future.cancel()
                    raise
                for (item, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)
                    elif self._orphaned is not None:
                        self._orphaned(item, result)
        finally:
            self._task = None
            # Only when this task itself was cancelled (the store closing).
            while self._pending:
                _, future = self._pending.popleft()
                if not future.done():
                    future.cancel()

    async def _send(self, items: Sequence[Item]) -> Sequence[Result]:
        for attempt in range(1, _DEADLOCK_ATTEMPTS + 1):
            try:
                results = await self._run(items)
            except Exception as exc:
                if attempt == _DEADLOCK_ATTEMPTS or not self._retry_if(exc):
                    raise
                log.info("a batched statement was a deadlock victim; sending it again")
                continue
            self.statements += 1
            self.items += len(items)
            return results
        raise AssertionError("unreachable")

    async def close(self) -> None:
        """Cancel the statement in flight, if any; waiting callers are cancelled."""
        task = self._task
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._task = None
        # A task cancelled before it first ran never reached its own clean-up.
        while self._pending:
            _, future = self._pending.popleft()
            future.cancel()
