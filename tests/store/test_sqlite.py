"""SQLite specifics: durability across reopen, bad paths and files, locks and purging."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from payonce.clock import ManualClock
from payonce.errors import ConfigError, StorageError, StorageTimeout
from payonce.store import Claim, ClaimStatus, SQLiteStore, StoredResponse, open_store
from payonce.store.group_commit import DUE_PER_TURN, MAX_MERGED, GroupCommit
from payonce.store.sqlite import PURGE_CHUNK


async def test_completed_records_survive_reopening(tmp_path: Path) -> None:
    clock = ManualClock()
    first = SQLiteStore(str(tmp_path / "p.db"), clock)
    claim = await first.claim("t", "k", "fp", lease=30, ttl=3600)
    await first.complete("t", "k", claim.record.token, StoredResponse(200, (), b"x"), ttl=3600)
    await first.close()
    second = SQLiteStore(str(tmp_path / "p.db"), clock)
    again = await second.claim("t", "k", "fp", lease=30, ttl=3600)
    assert again.status is ClaimStatus.COMPLETED and again.record.response is not None
    await second.close()


def test_missing_directory_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        SQLiteStore(str(tmp_path / "nope" / "p.db"))


def test_a_file_that_is_not_a_database_is_a_config_error(tmp_path: Path) -> None:
    bogus = tmp_path / "p.db"
    bogus.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ConfigError, match="cannot use"):
        SQLiteStore(str(bogus))


@pytest.mark.parametrize("url", ["redis://", "sqlite://", "sqlite:///", "mysql://h/db", ""])
def test_unsupported_urls_are_config_errors(url: str) -> None:
    with pytest.raises(ConfigError, match="--store"):
        open_store(url)


async def test_writes_of_one_turn_share_a_transaction_and_fail_together(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "p.db"), busy_timeout=0.05)
    claims = await asyncio.gather(
        *(store.claim("t", f"k{i}", "fp", lease=30, ttl=60) for i in range(5))
    )
    assert all(c.status is ClaimStatus.ACQUIRED for c in claims)
    locker = sqlite3.connect(tmp_path / "p.db", isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    results = await asyncio.gather(
        *(
            store.complete("t", f"k{i}", c.record.token, StoredResponse(200, (), b"x"), ttl=3600)
            for i, c in enumerate(claims)
        ),
        return_exceptions=True,
    )
    assert all(isinstance(r, StorageTimeout) for r in results)
    locker.execute("ROLLBACK")
    locker.close()
    for i in range(5):
        record = await store.get("t", f"k{i}")
        assert record is not None and record.response is None, "nothing of a failed batch is kept"
    done = await asyncio.gather(
        *(
            store.complete("t", f"k{i}", c.record.token, StoredResponse(200, (), b"x"), ttl=3600)
            for i, c in enumerate(claims)
        )
    )
    assert done == [True] * 5
    await store.close()


# --- Locks held by another connection never block the event loop (issue 12, item 6) ---


def _busy() -> sqlite3.OperationalError:
    error = sqlite3.OperationalError("database is locked")
    error.sqlite_errorcode = sqlite3.SQLITE_BUSY  # type: ignore[attr-defined]
    return error


class FlakyConnection:
    """Delegates to a real connection, but the statements ``meets_lock`` picks fail as
    SQLite fails them when another connection holds the lock (SQLITE_BUSY)."""

    def __init__(self, db: sqlite3.Connection, meets_lock: Callable[[str, int], bool]) -> None:
        self._db = db
        self._meets_lock = meets_lock
        self.executed: list[str] = []

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        self.executed.append(sql)
        if self._meets_lock(sql, len(self.executed)):
            raise _busy()
        return self._db.execute(sql, params)

    def __getattr__(self, name: str) -> Any:  # in_transaction, close
        return getattr(self._db, name)


def make_flaky(store: SQLiteStore, meets_lock: Callable[[str, int], bool]) -> FlakyConnection:
    flaky = FlakyConnection(store._db, meets_lock)
    store._db = flaky  # type: ignore[assignment]
    store._writes._db = flaky  # type: ignore[assignment]
    return flaky


async def claim_five(store: SQLiteStore) -> list[Claim]:
    return await asyncio.gather(
        *(store.claim("t", f"k{i}", "fp", lease=30, ttl=60) for i in range(5))
    )


async def assert_claimed_once(store: SQLiteStore, claims: list[Claim]) -> None:
    # Kept from a first, rolled-back run, a claim's row would carry another token
    # and the retry would see IN_PROGRESS instead of ACQUIRED.
    assert [c.status for c in claims] == [ClaimStatus.ACQUIRED] * 5
    for i, c in enumerate(claims):
        record = await store.get("t", f"k{i}")
        assert record is not None and record.token == c.record.token


@pytest.mark.parametrize(
    "where",
    ["BEGIN IMMEDIATE", "the third statement", "COMMIT"],
)
async def test_a_batch_that_meets_a_lock_is_rolled_back_and_run_again_whole(
    tmp_path: Path, where: str
) -> None:
    store = SQLiteStore(str(tmp_path / "p.db"))
    met: list[int] = []

    def meets_lock(sql: str, n: int) -> bool:
        hit = sql == where if where != "the third statement" else n == 4
        if hit and not met:
            met.append(n)
            return True
        return False

    flaky = make_flaky(store, meets_lock)
    claims = await claim_five(store)
    assert met, "the lock was never met"
    await assert_claimed_once(store, claims)
    assert flaky.executed.count("BEGIN IMMEDIATE") == 2
    assert flaky.executed.count("ROLLBACK") == (0 if where == "BEGIN IMMEDIATE" else 1)
    await store.close()


async def test_a_batch_waits_for_another_connections_lock_without_blocking_the_loop(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(str(tmp_path / "p.db"), busy_timeout=10)
    await store.ping()
    locker = sqlite3.connect(tmp_path / "p.db", isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    # Released from this very event loop: with a busy handler sleeping inside the
    # loop, the release could not run before the store's timeout.
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    asyncio.get_running_loop().call_later(0.3, locker.execute, "ROLLBACK")
    claims = await claim_five(store)
    ticker.cancel()
    await assert_claimed_once(store, claims)
    assert ticks >= 5, "the loop ran while the batch waited"
    locker.close()
    await store.close()


async def test_batches_that_wait_for_a_lock_commit_in_their_order(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    db = sqlite3.connect(path, isolation_level=None, timeout=0)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER)")
    writes = GroupCommit(db, lambda exc: StorageTimeout(str(exc)), timeout=10)
    locker = sqlite3.connect(path, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    first = writes.submit("INSERT INTO t VALUES ('x', 1)", (), fetch=False)
    await asyncio.sleep(0.05)  # the first batch met the lock and waits
    second = writes.submit("UPDATE t SET v = 2 WHERE k = 'x'", (), fetch=False)
    await asyncio.sleep(0.05)
    assert not first.done() and not second.done()
    locker.execute("ROLLBACK")
    assert await second == 1, "the update ran after the insert"
    assert first.done() and first.result() == 1
    assert db.execute("SELECT v FROM t").fetchone() == (2,)
    locker.close()
    db.close()


async def test_deferred_writes_due_together_commit_a_chunk_a_loop_turn(tmp_path: Path) -> None:
    # A thousand streams that write in the same instant must not hold the loop
    # for one transaction of them all: DUE_PER_TURN a turn, in their order, other
    # callbacks (a client's next event) between the chunks. A write that comes
    # meanwhile still waits for company (DEFER), not for the next turn.
    db = sqlite3.connect(tmp_path / "p.db", isolation_level=None, timeout=0)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE t (n INTEGER PRIMARY KEY)")
    writes = GroupCommit(db, lambda exc: StorageTimeout(str(exc)), timeout=10)
    count = MAX_MERGED + 10  # past the company that flushes at once, too

    def insert(n: int) -> asyncio.Future[int]:
        return writes.submit("INSERT INTO t VALUES (?)", (n,), fetch=False, deferred=True)

    futures = [insert(n) for n in range(count)]
    seen: list[int] = []  # rows committed when a callback queued after them all ran
    asyncio.get_running_loop().call_soon(
        lambda: seen.append(db.execute("SELECT COUNT(*) FROM t").fetchone()[0])
    )
    await futures[0]
    later = insert(count)  # the first chunk is in, the rest are not
    assert await asyncio.gather(*futures) == [1] * count
    assert seen == [DUE_PER_TURN]
    assert not later.done(), "a write that came during the chunks waits for its own window"
    assert await later == 1
    rows = db.execute("SELECT n FROM t ORDER BY rowid").fetchall()
    assert rows == [(n,) for n in range(count + 1)]
    db.close()


async def test_the_batches_that_queued_behind_a_lock_commit_together(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "p.db"), busy_timeout=10)
    await store.ping()
    flaky = make_flaky(store, lambda sql, n: False)  # records what runs; the lock is real
    locker = sqlite3.connect(tmp_path / "p.db", isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    turns = []
    for turn in range(3):  # three loop turns, three batches of two claims
        turns.append(asyncio.ensure_future(claim_pair(store, turn)))
        await asyncio.sleep(0.02)
    locker.execute("ROLLBACK")
    locker.close()
    claims = [c for pair in await asyncio.gather(*turns) for c in pair]
    assert [c.status for c in claims] == [ClaimStatus.ACQUIRED] * 6
    assert flaky.executed.count("COMMIT") == 1, "one transaction once the lock was free"
    await store.close()


async def claim_pair(store: SQLiteStore, turn: int) -> list[Claim]:
    return await asyncio.gather(
        *(store.claim("t", f"k{turn}-{i}", "fp", lease=30, ttl=60) for i in range(2))
    )


async def test_a_lock_held_past_the_timeout_fails_the_batch_and_keeps_nothing(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(str(tmp_path / "p.db"), busy_timeout=0.2)
    await store.ping()
    locker = sqlite3.connect(tmp_path / "p.db", isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    results = await asyncio.gather(
        *(store.claim("t", f"k{i}", "fp", lease=30, ttl=60) for i in range(3)),
        return_exceptions=True,
    )
    assert all(isinstance(r, StorageTimeout) for r in results), results
    locker.execute("ROLLBACK")
    locker.close()
    assert [await store.get("t", f"k{i}") for i in range(3)] == [None] * 3
    await store.close()


async def test_a_write_whose_caller_gave_up_while_it_waited_never_runs(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "p.db"), busy_timeout=10)
    await store.ping()
    locker = sqlite3.connect(tmp_path / "p.db", isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    abandoned = asyncio.create_task(store.claim("t", "gone", "fp", lease=30, ttl=60))
    kept = asyncio.create_task(store.claim("t", "kept", "fp", lease=30, ttl=60))
    await asyncio.sleep(0.05)
    abandoned.cancel()
    locker.execute("ROLLBACK")
    locker.close()
    assert (await kept).status is ClaimStatus.ACQUIRED
    assert await store.get("t", "gone") is None, "a claim nobody waits for would hold the key"
    await store.close()


async def test_reads_that_meet_a_lock_are_retried_until_the_timeout(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "p.db"), busy_timeout=0.2)
    claimed = await store.claim("t", "k", "fp", lease=30, ttl=60)
    misses = 3
    make_flaky(store, lambda sql, n: sql.startswith("SELECT") and n <= misses)
    record = await store.get("t", "k")
    assert record is not None and record.token == claimed.record.token
    make_flaky(store, lambda sql, n: sql.startswith("SELECT"))
    with pytest.raises(StorageTimeout):
        await store.read_events("t", "k")
    await store.close()


async def test_purge_deletes_in_chunks_with_their_events_and_keeps_live_records(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    store = SQLiteStore(str(tmp_path / "p.db"), clock)
    rows = PURGE_CHUNK * 2 + 500
    db = sqlite3.connect(tmp_path / "p.db", isolation_level=None)
    db.execute("BEGIN")
    db.executemany(
        "INSERT INTO payonce_records (tenant, key, fingerprint, state, token, created_at,"
        " lease_expires_at, expires_at) VALUES ('old', ?, 'fp', 'completed', 'x', 0, 0, ?)",
        [(f"k{i}", clock.now() - 1 - i) for i in range(rows)],
    )
    db.executemany(
        "INSERT INTO payonce_events (tenant, key, seq, data) VALUES ('old', ?, 1, X'00')",
        [(f"k{i}",) for i in range(rows)],
    )
    db.execute("COMMIT")
    db.close()
    live = await store.claim("t", "live", "fp", lease=30, ttl=60)
    await store.begin_stream("t", "live", live.record.token, 200, ())
    await store.append_events("t", "live", live.record.token, 1, [b"e"])
    assert await store.purge_expired(PURGE_CHUNK + 10) == PURGE_CHUNK + 10
    # The oldest went first, each with its events; the rest are untouched.
    assert await store.read_events("old", f"k{rows - 1}") == []
    assert await store.read_events("old", "k0") == [b"\x00"]
    assert await store.purge_expired() == rows - PURGE_CHUNK - 10
    for i in (0, rows // 2, rows - 1):
        assert await store.read_events("old", f"k{i}") == []
    assert await store.purge_expired() == 0
    assert await store.read_events("t", "live") == [b"e"]
    assert (await store.get("t", "live")) is not None
    await store.close()


async def test_a_running_call_is_never_purged_nor_taken_over_whatever_its_expiry(
    tmp_path: Path,
) -> None:
    # A record whose expiry passed while its lease is live, as a gateway of an
    # earlier version leaves it (its renewals did not push the expiry), sharing
    # the file during a rolling upgrade: its holder is running the call.
    clock = ManualClock()
    store = SQLiteStore(str(tmp_path / "p.db"), clock)
    claimed = await store.claim("t", "k", "fp", lease=30, ttl=60)
    await store.begin_stream("t", "k", claimed.record.token, 200, ())
    await store.append_events("t", "k", claimed.record.token, 1, [b"e"])
    db = sqlite3.connect(tmp_path / "p.db", isolation_level=None)
    db.execute("UPDATE payonce_records SET expires_at = ?", (clock.now() - 1,))
    db.close()
    assert await store.purge_expired() == 0
    assert await store.read_events("t", "k") == [b"e"]
    again = await store.claim("t", "k", "fp", lease=30, ttl=60)
    assert again.status is ClaimStatus.IN_PROGRESS, "a duplicate took a running call over"
    assert again.record.token == claimed.record.token
    clock.advance(31)  # the holder stopped renewing: its lease lapsed, the record goes
    assert await store.purge_expired() == 1
    await store.close()


async def test_closing_fails_the_writes_still_waiting_for_a_lock(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "p.db"), busy_timeout=10)
    await store.ping()
    locker = sqlite3.connect(tmp_path / "p.db", isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    waiting = asyncio.create_task(store.claim("t", "k", "fp", lease=30, ttl=60))
    await asyncio.sleep(0.05)
    await store.close()
    with pytest.raises(StorageError, match="closed"):
        await waiting
    locker.execute("ROLLBACK")
    locker.close()


# --- Thousands of streams in flight (issue 19, workload 4) ---


async def test_event_appends_of_many_turns_share_a_transaction_and_a_claim_does_not_wait(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(str(tmp_path / "p.db"))
    streams = await asyncio.gather(
        *(store.claim("t", f"s{i}", "fp", lease=30, ttl=60) for i in range(20))
    )
    for i, c in enumerate(streams):
        assert await store.begin_stream("t", f"s{i}", c.record.token, 200, ())
    flaky = make_flaky(store, lambda sql, n: False)
    appends = []
    for i, c in enumerate(streams):  # one stream's event per loop turn
        appends.append(
            asyncio.ensure_future(store.append_events("t", f"s{i}", c.record.token, 1, [b"e"]))
        )
        await asyncio.sleep(0)
    renewals = [store.renew("t", f"s{i}", c.record.token, lease=30) for i, c in enumerate(streams)]
    assert await asyncio.gather(*appends, *renewals) == [True] * 40
    assert flaky.executed.count("COMMIT") == 1, "twenty turns' appends and renewals, one commit"
    flaky.executed.clear()
    token = streams[0].record.token
    pending = asyncio.ensure_future(store.append_events("t", "s0", token, 2, [b"f"]))
    await asyncio.sleep(0)
    claim = await asyncio.wait_for(store.claim("t", "new", "fp", lease=30, ttl=60), 1)
    assert claim.status is ClaimStatus.ACQUIRED
    assert not pending.done(), "the claim committed alone, not behind the waiting append"
    assert await pending
    assert await store.read_events("t", "s0") == [b"e", b"f"]
    await store.close()
