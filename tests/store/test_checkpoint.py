"""The SQLite store's checkpointer thread, on real files (payonce.store.checkpoint).

Whether the event loop ever syncs is shown from the outside, on a gateway over
a slow disk (tests/gateway/test_sqlite_nonblocking.py). Here: that the WAL is
checkpointed and started over while a connection like the loop's (automatic
checkpoints off) keeps writing, that nothing written is lost, that an idle
store costs nothing, and that one process of several is elected.

The WAL's restarts are counted in the WAL file's header, as SQLite made them,
and the writing goes on until enough were seen: no bound on how many rows come
in a given time, which depends on the machine. The thread's own ``rows``
counts the rows it committed for one, and SQLite starts the WAL over in such a
row only if no other commit landed between the start of the checkpoint and the
row's snapshot (with rows 0.5 ms apart, about one in eight here; one in twenty
on a busy machine); its ``restarts`` counts the restarts in its header, as this
test does.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from payonce.store import SQLiteStore
from payonce.store.checkpoint import NICE, Checkpointer

INTERVAL = 0.05
FORCE = 256  # frames
RESTARTS = 5  # times the WAL must be seen to start over while rows keep coming
PATIENCE = 60.0  # seconds for them: a bound on a stall, not on speed (about 2 s here when idle)


def _loop_connection(db: Path) -> sqlite3.Connection:
    """A connection as the store's loop has it: WAL, no automatic checkpoints."""
    asyncio.run(SQLiteStore(str(db)).close())  # the schema
    conn = sqlite3.connect(db, isolation_level=None, timeout=0)  # busy: at once, as the loop's
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("CREATE TABLE rows (n INTEGER PRIMARY KEY, data BLOB)")
    return conn


def _insert(
    conn: sqlite3.Connection, data: str = "randomblob(3000)", hold: threading.Event | None = None
) -> None:
    """One row, waiting out the checkpointer's write lock (and ``hold``) as the store does.

    As GroupCommit: 1 ms, doubling to 50 ms.
    """
    delay, deadline = 0.001, time.monotonic() + 5
    while True:
        try:
            if hold is not None and hold.is_set():
                raise sqlite3.OperationalError("database is locked (held)")
            conn.execute(f"INSERT INTO rows (data) VALUES ({data})")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(2 * delay, 0.05)


def _wait(condition: object, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not within 10 s"
        time.sleep(0.01)


def _salt(wal: BinaryIO) -> int:
    """Salt-1 of the WAL's header, which SQLite adds one to each time the WAL starts over.

    The header is rewritten by the commit that writes the new WAL's first frame
    (https://www.sqlite.org/fileformat2.html#walformat).
    """
    return int.from_bytes(os.pread(wal.fileno(), 4, 16), "big")


def _restarts(wal: BinaryIO, since: int) -> int:
    return (_salt(wal) - since) % 2**32


class _Hold(threading.Event):
    """The checkpointer's ``hold``, counting the WAL's restarts while it was set (forced ones)."""

    def __init__(self, wal: BinaryIO) -> None:
        super().__init__()
        self._wal = wal
        self._salt = 0
        self.restarts = 0

    def set(self) -> None:
        self._salt = _salt(self._wal)
        super().set()

    def clear(self) -> None:
        self.restarts += _restarts(self._wal, self._salt)
        super().clear()


def _write_until(
    conn: sqlite3.Connection,
    wal: BinaryIO,
    restarted: Callable[[], int],
    pause: float,
    hold: threading.Event | None = None,
) -> int:
    """Rows, ``pause`` apart, until ``restarted()`` comes to RESTARTS; how many were written.

    Fails after PATIENCE seconds: a checkpointer that never starts the WAL over.
    """
    written = 0
    deadline = time.monotonic() + PATIENCE
    while restarted() < RESTARTS:
        assert time.monotonic() < deadline, (
            f"the WAL started over {restarted()} times in {PATIENCE:g} s ({written} rows,"
            f" WAL {os.fstat(wal.fileno()).st_size // 2**20} MiB)"
        )
        _insert(conn, hold=hold)
        written += 1
        if pause:
            time.sleep(pause)
    return written


def _intact(conn: sqlite3.Connection, db: Path, written: int) -> None:
    assert conn.execute("SELECT count(*) FROM rows").fetchone()[0] == written
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    reopened = sqlite3.connect(db)
    assert reopened.execute("SELECT count(*) FROM rows").fetchone()[0] == written
    reopened.close()


def test_the_wal_is_copied_and_started_over_while_writes_keep_coming(tmp_path: Path) -> None:
    """As from a busy loop: a row, half a millisecond, the next row."""
    db = tmp_path / "busy.db"
    conn = _loop_connection(db)
    checkpointer = Checkpointer(str(db), interval=INTERVAL, restart=1, force=10**9, cap=10**9)
    checkpointer.start()
    with open(f"{db}-wal", "rb") as wal:
        first = _salt(wal)
        try:
            written = _write_until(conn, wal, lambda: _restarts(wal, first), pause=0.0005)
        finally:
            checkpointer.stop()
        restarts = _restarts(wal, first)
    stats = checkpointer.stats
    # Without forced rounds: the gaps between writes are enough. The WAL starts
    # over in one of the thread's rows or in a loop commit that finds it all
    # copied; the thread counts them from the header as this test does (one more
    # at most: start()'s round, before `first`), not the rows it wrote.
    assert stats.elected and stats.forced == 0 and stats.errors == 0, stats
    assert restarts <= stats.restarts <= restarts + 1, (restarts, stats)
    assert stats.rows > 0, stats
    _intact(conn, db, written)


def test_writes_without_a_pause_are_held_for_a_forced_restart(tmp_path: Path) -> None:
    """No gap between writes: rounds from FORCE frames on hold them, copy the rest, restart."""
    db = tmp_path / "saturated.db"
    conn = _loop_connection(db)
    with open(f"{db}-wal", "rb") as wal:
        hold = _Hold(wal)
        checkpointer = Checkpointer(
            str(db), interval=INTERVAL, restart=1, force=FORCE, cap=10**9, hold=hold
        )
        checkpointer.start()
        try:
            # Only the restarts made while the writes were held: those are the forced ones.
            written = _write_until(conn, wal, lambda: hold.restarts, pause=0, hold=hold)
        finally:
            checkpointer.stop()
    stats = checkpointer.stats
    assert stats.forced >= hold.restarts and stats.errors == 0, (hold.restarts, stats)
    _intact(conn, db, written)


def test_an_idle_store_is_not_checkpointed(tmp_path: Path) -> None:
    db = tmp_path / "idle.db"
    conn = _loop_connection(db)
    _insert(conn, "x'00'")
    checkpointer = Checkpointer(str(db), interval=INTERVAL)
    checkpointer.start()
    try:
        _wait(lambda: checkpointer.stats.checkpoints >= 1)
        time.sleep(10 * INTERVAL)
        idle = checkpointer.stats.checkpoints
        time.sleep(10 * INTERVAL)
        assert checkpointer.stats.checkpoints == idle, "checkpoints while nothing was written"
        assert checkpointer.stats.restarts == 0, "a small WAL started over (a sync for nothing)"
        _insert(conn, "x'01'")
        _wait(lambda: checkpointer.stats.checkpoints > idle)
    finally:
        checkpointer.stop()
        conn.close()


def test_the_checkpoint_thread_runs_below_the_loop(tmp_path: Path) -> None:
    # On the loop's core at equal priority, a round halved the loop's share of it
    # and clients' events came 10-40 ms late in bursts; the loop's thread (this
    # one) keeps its priority.
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    checkpointer = Checkpointer(str(tmp_path / "nice.db"), interval=INTERVAL)
    checkpointer.start()
    try:
        thread = checkpointer._thread.native_id
        assert thread is not None
        _wait(lambda: os.getpriority(os.PRIO_PROCESS, thread) != own)
        assert os.getpriority(os.PRIO_PROCESS, thread) == min(19, own + NICE)
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == own
    finally:
        checkpointer.stop()


def test_one_checkpointer_per_database_and_another_takes_over(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    conn = _loop_connection(db)
    first = Checkpointer(str(db), interval=INTERVAL)
    second = Checkpointer(str(db), interval=INTERVAL)
    first.start()
    second.start()
    try:
        assert first.stats.elected and not second.stats.elected
        _insert(conn, "x'00'")
        _wait(lambda: first.stats.checkpoints >= 2)
        assert second.stats.checkpoints == 0
        first.stop()  # as a process that exits lets go of the lock
        _wait(lambda: second.stats.elected)
        _insert(conn, "x'01'")
        _wait(lambda: second.stats.checkpoints >= 1)
    finally:
        first.stop()
        second.stop()
        conn.close()
    assert (tmp_path / "shared.db-checkpointer").exists()


def test_the_store_stops_its_checkpointer_when_closed(tmp_path: Path) -> None:
    async def run() -> Checkpointer:
        store = SQLiteStore(str(tmp_path / "closed.db"))
        checkpointer = store._checkpointer
        assert checkpointer is not None and checkpointer.stats.elected
        await store.close()
        return checkpointer

    checkpointer = asyncio.run(run())
    assert not checkpointer._thread.is_alive()
    # The last connection closed: SQLite copied and removed the WAL.
    assert not (tmp_path / "closed.db-wal").exists()
