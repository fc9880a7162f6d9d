"""The SQLite store's checkpointer thread, on real files (payonce.store.checkpoint).

Whether the event loop ever syncs is shown from the outside, on a gateway over
a slow disk (tests/gateway/test_sqlite_nonblocking.py). Here: that the WAL is
checkpointed and started over while a connection like the loop's (automatic
checkpoints off) keeps writing, that nothing written is lost, that an idle
store costs nothing, and that one process of several is elected.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

from payonce.store import SQLiteStore
from payonce.store.checkpoint import Checkpointer

INTERVAL = 0.05
FORCE = 256  # frames


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


def _write_for(
    conn: sqlite3.Connection,
    checkpointer: Checkpointer,
    seconds: float,
    pause: float,
    hold: threading.Event | None = None,
) -> tuple[int, int]:
    """Rows written for ``seconds``, ``pause`` apart; (rows, most WAL frames seen)."""
    written = largest = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        _insert(conn, hold=hold)
        written += 1
        if pause:
            time.sleep(pause)
        largest = max(largest, checkpointer.stats.wal_frames)
    return written, largest


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
    try:
        written, largest = _write_for(conn, checkpointer, 3, pause=0.0005)
    finally:
        checkpointer.stop()
    stats = checkpointer.stats
    assert stats.elected and stats.checkpoints > 10 and stats.restarts > 10, stats
    assert stats.errors == 0 and stats.forced == 0, stats
    # Without forced rounds: the gaps between writes are enough for the thread's
    # restarts. Each row is a frame or more, so a WAL that never started over
    # would have come to hold more frames than rows written.
    assert largest < written, (largest, written, stats)
    _intact(conn, db, written)


def test_writes_without_a_pause_are_held_for_a_forced_restart(tmp_path: Path) -> None:
    """No gap between writes: rounds from FORCE frames on hold them, copy the rest, restart."""
    db = tmp_path / "saturated.db"
    conn = _loop_connection(db)
    hold = threading.Event()
    checkpointer = Checkpointer(
        str(db), interval=INTERVAL, restart=1, force=FORCE, cap=10**9, hold=hold
    )
    checkpointer.start()
    try:
        written, largest = _write_for(conn, checkpointer, 3, pause=0, hold=hold)
    finally:
        checkpointer.stop()
    stats = checkpointer.stats
    assert stats.forced > 0 and stats.restarts > 0 and stats.errors == 0, stats
    assert largest < written, (largest, written, stats)
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
