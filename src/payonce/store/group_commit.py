"""Group commit for SQLite: the writes submitted in one event-loop turn share one transaction.

Each autocommit write pays for its own transaction: WAL-index locks (``fcntl``),
a WAL frame write for every page it touched, and a commit record. Under load,
several requests reach the store in the same turn of the event loop (their
bytes arrived in the same poll); running their statements in one
``BEGIN IMMEDIATE`` … ``COMMIT`` pays those costs once. On this project's
machines a transaction of four claim-and-complete pairs cost half as much per
pair as four separate ones (docs/benchmarks.md).

Atomicity is unchanged: each statement is still executed alone and in order,
and no result is handed out before the transaction commits. If the commit (or
any statement) fails, every statement of the batch fails with the translated
error and nothing of it is kept.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from typing import Any

__all__ = ["GroupCommit"]

# One write: (sql, params, fetch the first row (True) or the row count (False), future).
_Write = tuple[str, Any, bool, "asyncio.Future[Any]"]


class GroupCommit:
    """Queues write statements and runs each turn's queue as one transaction."""

    def __init__(
        self, db: sqlite3.Connection, translate: Callable[[sqlite3.Error], Exception]
    ) -> None:
        self._db = db
        self._translate = translate
        self._pending: list[_Write] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def submit(self, sql: str, params: Any, *, fetch: bool) -> asyncio.Future[Any]:
        """Queue one statement; the future gets its first row (``fetch``) or its row count."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append((sql, params, fetch, future))
        return future

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        db = self._db
        results: list[Any] = []
        try:
            if len(batch) > 1:
                db.execute("BEGIN IMMEDIATE")
            for sql, params, fetch, _ in batch:
                cursor = db.execute(sql, params)
                results.append(cursor.fetchone() if fetch else cursor.rowcount)
            if len(batch) > 1:
                db.execute("COMMIT")
        except sqlite3.Error as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            for *_, future in batch:
                if not future.done():
                    future.set_exception(self._translate(exc))
            return
        for (*_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)
