"""Group commit for SQLite: the writes submitted in one event-loop turn share one transaction.

Each autocommit write pays for its own transaction: WAL-index locks (``fcntl``),
a WAL frame write for every page it touched, and a commit record. Under load,
several requests reach the store in the same turn of the event loop (their
bytes arrived in the same poll); running their statements in one
``BEGIN IMMEDIATE`` … ``COMMIT`` pays those costs once. On this project's
machines a transaction of four claim-and-complete pairs cost half as much per
pair as four separate ones (benchmarks/NOTEBOOK.md).

Atomicity is unchanged: each statement is still executed alone and in order,
and no result is handed out before the transaction commits. If the commit (or
any statement) fails, every statement of the batch fails with the translated
error and nothing of it is kept.

Another process's lock never blocks the event loop. The connection has no busy
timeout, so a batch that meets a lock (``SQLITE_BUSY``) fails at once; it is
rolled back, whatever part of it had run is discarded, and the whole batch is
tried again later from a timer, 1 ms after the first miss and doubling up to
50 ms, until ``timeout`` seconds have passed since it was first due. Then it
fails with the translated error (a 503 for the requests waiting on it). While
a batch waits, the batches after it queue behind it (each with its own
deadline), and the retries run the queue as one transaction of whole batches,
oldest first, so batches still commit in the order they were submitted. A
statement whose caller has given up (its future was cancelled) while its batch
waited is left out of the retries: nobody will learn whether it ran, so it must
not run later (a claim nobody holds would keep its key busy for a whole lease).

Writes that nobody waits on to answer a client (a stream's event appends,
lease renewals, replay counts) are submitted ``deferred``: they wait up to
``DEFER`` seconds for company instead of committing in the next turn. With
thousands of streams in flight, each appending one event a second, a
transaction per loop turn wrote a few WAL pages per event; one transaction per
``DEFER`` writes each touched page once (less than half the bytes, see
benchmarks/NOTEBOOK.md). The other writes (claims, completions) keep their
per-turn transactions and never carry the deferred ones, so a claim never waits
behind them. The two lanes commit separately: a caller that needs one write
after another of the same key awaits the first (the recorder awaits its appends
before it completes or releases the stream).
"""

from __future__ import annotations

import asyncio
import collections
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["DEFER", "DUE_PER_TURN", "GroupCommit", "is_busy"]

# One write: (sql, params, fetch the first row (True) or the row count (False), future).
_Write = tuple[str, Any, bool, "asyncio.Future[Any]"]

# Retry delays after a batch met another process's lock: short at first, since
# most locks are a single commit of another worker, then capped.
FIRST_RETRY = 0.001
MAX_RETRY = 0.05
# Statements per transaction when the batches that waited for a lock run: a
# few milliseconds of the loop at most.
MAX_MERGED = 256
# Deferred writes due together committed per loop turn: about a millisecond of
# stream appends (a quarter of MAX_MERGED measured no worse, benchmarks/NOTEBOOK.md).
DUE_PER_TURN = 64
# How long a deferred write may wait for others to share its transaction.
DEFER = 0.02

# Primary result codes (the low byte of the extended code) that mean "another
# connection holds a lock": retried, never a failure until the timeout.
_BUSY_CODES = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
# What a batch meets while the checkpointer holds this process's writes.
_HELD = sqlite3.OperationalError("database is locked (held while the WAL starts over)")


def is_busy(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` is SQLite's "another connection holds the lock" (worth retrying)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in _BUSY_CODES


class _Busy(Exception):
    """The batch met a lock and was rolled back; carries SQLite's error."""

    def __init__(self, error: sqlite3.Error) -> None:
        super().__init__(str(error))
        self.error = error


class GroupCommit:
    """Queues write statements and runs each turn's queue as one transaction."""

    def __init__(
        self,
        db: sqlite3.Connection,
        translate: Callable[[sqlite3.Error], Exception],
        *,
        timeout: float = 5.0,
        hold: threading.Event | None = None,
    ) -> None:
        """``hold``: while set, no batch starts; they wait as if the database were locked.

        The checkpointer sets it for the moment it starts the WAL over
        (:mod:`payonce.store.checkpoint`): no write of this process may come
        between its checkpoint and its restart.
        """
        self._db = db
        self._hold = hold
        self._translate = translate
        self._timeout = timeout
        self._pending: list[_Write] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        # Batches that met a lock, oldest first, with their deadlines (monotonic).
        self._waiting: collections.deque[tuple[list[_Write], float]] = collections.deque()
        self._delay = FIRST_RETRY
        self._timer: asyncio.TimerHandle | None = None
        self._deferred: list[_Write] = []
        self._later: asyncio.Handle | None = None  # the deferred writes' flush
        # How many writes at the head of _deferred are due (their window ended),
        # committed DUE_PER_TURN a turn by _drain (scheduled: _draining).
        self._due = 0
        self._draining: asyncio.Handle | None = None

    def submit(
        self, sql: str, params: Any, *, fetch: bool, deferred: bool = False
    ) -> asyncio.Future[Any]:
        """Queue one statement; the future gets its first row (``fetch``) or its row count.

        ``deferred``: the statement may wait up to ``DEFER`` seconds so that
        more writes share its transaction (module docstring).
        """
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        future = loop.create_future()
        if deferred:
            if self._later is None:
                self._later = loop.call_later(DEFER, self._flush_deferred)
            self._deferred.append((sql, params, fetch, future))
            if len(self._deferred) - self._due == MAX_MERGED:  # enough company
                self._later.cancel()
                self._later = loop.call_soon(self._flush_deferred)
            return future
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append((sql, params, fetch, future))
        return future

    def _flush_deferred(self) -> None:
        self._later = None
        self._due = len(self._deferred)  # what queued until now; later writes wait their turn
        if self._draining is None:
            self._drain()

    def _drain(self) -> None:
        # At most DUE_PER_TURN a loop turn: a thousand streams that write in the same
        # instant (started together, each once a second) would otherwise hold the
        # loop for one transaction of them all, every client's next event behind it.
        # Only the writes due at the flush: one that comes meanwhile waits for
        # company as usual (benchmarks/NOTEBOOK.md, "Deferred writes a chunk a turn").
        self._draining = None
        taken = min(self._due, DUE_PER_TURN)
        batch, self._deferred = self._deferred[:taken], self._deferred[taken:]
        self._due -= taken
        if self._due:
            assert self._loop is not None
            self._draining = self._loop.call_soon(self._drain)
        self._commit(batch)

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        self._commit(batch)

    def _commit(self, batch: list[_Write]) -> None:
        if not batch:  # closed in the meantime
            return
        if self._waiting:  # behind a batch that waits for a lock: keep the order
            self._waiting.append((batch, time.monotonic() + self._timeout))
            return
        try:
            self._run(batch)
        except _Busy as busy:
            if self._timeout <= 0:
                self._fail(batch, busy.error)
                return
            self._waiting.append((batch, time.monotonic() + self._timeout))
            self._delay = FIRST_RETRY
            self._schedule(self._delay)

    def _schedule(self, delay: float) -> None:
        assert self._loop is not None
        self._timer = self._loop.call_later(delay, self._retry)

    def close(self, error: Exception) -> None:
        """Fail what has not run yet with ``error``: the connection is about to close."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._later is not None:
            self._later.cancel()
            self._later = None
        if self._draining is not None:
            self._draining.cancel()
            self._draining = None
        self._due = 0
        batches = [batch for batch, _ in self._waiting] + [self._pending, self._deferred]
        self._waiting.clear()
        self._pending, self._deferred = [], []  # the flush already scheduled finds nothing to do
        for batch in batches:
            for *_, future in batch:
                if not future.done():
                    future.set_exception(error)

    def _retry(self) -> None:
        # The waiting batches run together, oldest first, as one transaction of
        # whole batches (up to MAX_MERGED statements; the rest in the next turn):
        # once the lock is free, the backlog that queued behind it costs a few
        # commits instead of one per loop turn it spent waiting.
        self._timer = None
        group: list[_Write] = []
        taken = 0
        for batch, _ in self._waiting:
            if group and len(group) + len(batch) > MAX_MERGED:
                break
            group += [write for write in batch if not write[3].cancelled()]
            taken += 1
        try:
            if group:
                self._run(group)
        except _Busy as busy:
            now = time.monotonic()
            expired: list[_Write] = []
            while self._waiting and self._waiting[0][1] <= now:  # deadlines grow along it
                expired += self._waiting.popleft()[0]
            if expired:
                self._fail(expired, busy.error)
            if self._waiting:
                self._delay = min(self._delay * 2, MAX_RETRY)
                self._schedule(min(self._delay, self._waiting[0][1] - now))
            return
        for _ in range(taken):
            self._waiting.popleft()
        self._delay = FIRST_RETRY
        if self._waiting:
            self._schedule(0)

    def _run(self, batch: list[_Write]) -> None:
        """Run ``batch`` as one transaction and hand out its results; raise _Busy to retry."""
        db = self._db
        results: list[Any] = []
        if self._hold is not None and self._hold.is_set():
            raise _Busy(_HELD)
        try:
            if len(batch) > 1:
                db.execute("BEGIN IMMEDIATE")
            for sql, params, fetch, _ in batch:
                cursor = db.execute(sql, params)
                results.append(cursor.fetchone() if fetch else cursor.rowcount)
            if len(batch) > 1:
                db.execute("COMMIT")
        except sqlite3.Error as exc:
            # A lock can stop the batch at its BEGIN, at any statement (a single
            # statement in autocommit) or at its COMMIT: none of it is kept.
            if db.in_transaction:
                db.execute("ROLLBACK")
            if is_busy(exc):
                raise _Busy(exc) from exc
            self._fail(batch, exc)
            return
        for (*_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)

    def _fail(self, batch: list[_Write], exc: sqlite3.Error) -> None:
        error = self._translate(exc)
        for *_, future in batch:
            if not future.done():
                future.set_exception(error)
