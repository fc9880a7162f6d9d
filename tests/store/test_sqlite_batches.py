"""A stream's events stored a batch to a row (store/batches.py, SQLite schema 3)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from payonce.clock import ManualClock
from payonce.errors import ConfigError, RecordUnreadable
from payonce.store import SQLiteStore
from payonce.store.batches import pack, unpack
from payonce.store.sealing import PLAIN, Sealing
from payonce.store.sqlite import SCHEMA_VERSION

EVENTS = [b'data: {"n": %d}\n\n' % n for n in range(1, 51)]

# The tables as schema 2 made them (payonce 0.3): one event a row.
_SCHEMA_2 = """
CREATE TABLE payonce_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO payonce_meta VALUES ('schema_version', '2');
CREATE TABLE payonce_records (
    tenant TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL, state TEXT NOT NULL,
    token TEXT NOT NULL, created_at REAL NOT NULL, lease_expires_at REAL NOT NULL,
    expires_at REAL NOT NULL, completed_at REAL, status INTEGER, headers TEXT, body BLOB,
    replays INTEGER NOT NULL DEFAULT 0, usage TEXT, cost_usd REAL,
    stream INTEGER NOT NULL DEFAULT 0, events INTEGER NOT NULL DEFAULT 0,
    UNIQUE (tenant, key)
);
CREATE INDEX payonce_records_expiry ON payonce_records (expires_at);
CREATE TABLE payonce_events (
    tenant TEXT NOT NULL, key TEXT NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (tenant, key, seq)
) WITHOUT ROWID;
"""


@given(st.lists(st.binary(max_size=300), min_size=1, max_size=40))
def test_a_packed_batch_unpacks_to_its_events(events: list[bytes]) -> None:
    assert unpack(pack(events), len(events)) == events


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"\x00\x00\x00\x03",
        pack([b"a", b"b"]) + b"x",
        pack([b"a", b"b"])[:-1],
        pack([b"a"] * 3),
    ],
)
def test_a_damaged_batch_is_refused(value: bytes) -> None:
    with pytest.raises(ValueError, match="damaged"):
        unpack(value, 2)


def _rows(path: Path) -> list[tuple[int, int]]:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT seq, span FROM payonce_events ORDER BY seq").fetchall()


async def _stream(store: SQLiteStore, key: str) -> str:
    claim = await store.claim("t", key, "fp", lease=30, ttl=60)
    token = claim.record.token
    assert await store.begin_stream("t", key, token, 200, ())
    return token


@pytest.mark.parametrize("sealed", [False, True], ids=["plain", "sealed"])
async def test_a_batch_is_one_row_and_reads_back_from_any_event(
    tmp_path: Path, sealed: bool
) -> None:
    path = tmp_path / "p.db"
    store = SQLiteStore(str(path), ManualClock(), codec=Sealing([b"k" * 32]) if sealed else PLAIN)
    token = await _stream(store, "k")
    assert await store.append_events("t", "k", token, 1, EVENTS[:30])
    assert await store.append_events("t", "k", token, 31, EVENTS[30:31])
    assert await store.append_events("t", "k", token, 32, EVENTS[31:])
    assert _rows(path) == [(30, 30), (31, 1), (50, 19)]
    for after in (0, 1, 29, 30, 31, 45, 49, 50):
        assert await store.read_events("t", "k", after) == EVENTS[after:], after
    record = await store.get("t", "k")
    assert record is not None and record.events == 50
    await store.close()


async def test_a_batch_written_again_longer_overlaps_and_reads_once(tmp_path: Path) -> None:
    # A write that failed is written again from the same first event with what
    # came meanwhile: a SQLite transaction that failed kept nothing, but should
    # both rows be there, each event is read once.
    path = tmp_path / "p.db"
    store = SQLiteStore(str(path), ManualClock())
    token = await _stream(store, "k")
    assert await store.append_events("t", "k", token, 1, EVENTS[:10])
    assert await store.append_events("t", "k", token, 1, EVENTS[:15])
    assert await store.append_events("t", "k", token, 16, EVENTS[15:20])
    assert _rows(path) == [(10, 10), (15, 15), (20, 5)]
    for after in (0, 5, 10, 12, 15, 19):
        assert await store.read_events("t", "k", after) == EVENTS[after:20], after
    await store.close()


async def test_a_damaged_row_is_an_unreadable_record_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    store = SQLiteStore(str(path), ManualClock())
    token = await _stream(store, "k")
    assert await store.append_events("t", "k", token, 1, EVENTS[:5])
    with sqlite3.connect(path) as db:
        db.execute("UPDATE payonce_events SET span = 4")
    with pytest.raises(RecordUnreadable, match="damaged"):
        await store.read_events("t", "k")
    await store.close()


async def test_a_schema_2_file_is_brought_to_3_and_its_rows_read_as_single_events(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    clock = ManualClock()
    with sqlite3.connect(path) as db:
        db.executescript(_SCHEMA_2)
        db.execute(
            "INSERT INTO payonce_records (tenant, key, fingerprint, state, token, created_at,"
            " lease_expires_at, expires_at, completed_at, status, headers, body, stream)"
            " VALUES ('t', 'old', 'fp', 'completed', 'x', ?1, ?1, ?2, ?1, 200, '[]', X'', 1)",
            (clock.now(), clock.now() + 3600),
        )
        db.executemany(
            "INSERT INTO payonce_events VALUES ('t', 'old', ?, ?)",
            [(n, EVENTS[n - 1]) for n in (1, 2, 3)],
        )
    store = SQLiteStore(str(path), clock)
    with sqlite3.connect(path) as db:
        version = db.execute("SELECT value FROM payonce_meta").fetchone()[0]
    assert version == str(SCHEMA_VERSION) == "3"
    assert await store.read_events("t", "old") == EVENTS[:3]
    assert await store.read_events("t", "old", 2) == EVENTS[2:3]
    record = await store.get("t", "old")
    assert record is not None and record.events == 3
    # New streams beside it are written a batch to a row.
    token = await _stream(store, "new")
    assert await store.append_events("t", "new", token, 1, EVENTS[:4])
    assert await store.read_events("t", "new") == EVENTS[:4]
    await store.close()
    # Opened again (another worker's start): nothing more to do, nothing lost.
    again = SQLiteStore(str(path), clock)
    assert await again.read_events("t", "old") == EVENTS[:3]
    await again.close()


def test_a_file_of_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    SQLiteStore(str(path), ManualClock())  # creates it
    with sqlite3.connect(path) as db:
        db.execute("UPDATE payonce_meta SET value = ?", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(ConfigError, match="newer payonce"):
        SQLiteStore(str(path), ManualClock())
