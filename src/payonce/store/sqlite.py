"""``sqlite:///path.db``: the embedded default. Survives restarts; shared by worker processes.

sqlite3 runs inline on the event loop: each statement here is a few tens of
microseconds, and a thread hand-off (aiosqlite) measured slower per request on
this project's machines (benchmarks/NOTEBOOK.md). WAL mode lets readers proceed while
one writer commits; ``synchronous=NORMAL`` keeps a process crash safe (an OS
crash may lose the last commits, which only means a retry runs again) and
syncs nothing at commit. What does sync the disk, checkpoints and the WAL
starting over, runs on a thread (:mod:`payonce.store.checkpoint`): this
connection never checkpoints.

Every state change is a single statement, hence atomic across processes too.
Writes submitted in the same event-loop turn share one transaction
(:mod:`payonce.store.group_commit`).

Nothing here waits for a lock inside the event loop. Once the file is open
(opening may wait up to the timeout, before the gateway serves), the connection
has no busy timeout: a statement that meets another process's lock (another
``--workers`` process, a backup, an operator's ``sqlite3``) fails at once with
``SQLITE_BUSY``, and is tried again from a timer, 1 ms later and doubling up to
50 ms, until ``?timeout=`` seconds have passed; then the request gets 503. The
group commit retries its writes that way, whole batches at a time; reads (which
WAL lets through a writer, but not through the recovery of a WAL left by a
crashed process) retry the same way with ``asyncio.sleep``.

Expired records are purged in chunks of 1000 rows (a chunk's events with its
records, in one transaction, a few milliseconds), pausing between chunks for as
long as the chunk took, so a backlog of a million rows is worked off over
seconds while requests keep being served.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from payonce.clock import Clock, SystemClock
from payonce.errors import ConfigError, RecordUnreadable, StorageError, StorageTimeout
from payonce.store.base import (
    Appended,
    Claim,
    ClaimStatus,
    Record,
    RecordState,
    StoredResponse,
    held_expiry,
    new_token,
)
from payonce.store.batches import pack, unpack
from payonce.store.checkpoint import JOURNAL_SIZE_LIMIT, Checkpointer
from payonce.store.group_commit import FIRST_RETRY, MAX_RETRY, GroupCommit, is_busy
from payonce.store.rows import record_from_row
from payonce.store.sealing import PLAIN, Codec
from payonce.store.waiters import Waiters, wait_for_change

__all__ = ["SQLiteStore"]

# Python 3.11's sqlite3 binds int, float, str and bytearray parameters as they are,
# but sends every bytes parameter (an event, a body) through its adaptation
# protocol: a registry miss, then a lookup of ``__adapt__`` on the protocol type
# that builds and discards a formatted AttributeError, about 1,450 instructions a
# parameter (callgrind, 4 bytes parameters a statement: 38.4k -> 32.6k). A
# registered adapter is found first; ``bytes`` returns an exact bytes object
# itself. Process-wide, and the same values bound either way.
sqlite3.register_adapter(bytes, bytes)

# 3: a row of payonce_events holds a batch of events (its span), not one. A file of
# schema 2 is brought to 3 at start-up (its rows are batches of one); an earlier
# payonce refuses a file of schema 3, whose rows it would read as single events.
SCHEMA_VERSION = 3
_SCHEMA = """
CREATE TABLE IF NOT EXISTS payonce_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS payonce_records (
    tenant TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    state TEXT NOT NULL,
    token TEXT NOT NULL,
    created_at REAL NOT NULL,
    lease_expires_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    completed_at REAL,
    status INTEGER,
    headers TEXT,
    body BLOB,
    replays INTEGER NOT NULL DEFAULT 0,
    usage TEXT,
    cost_usd REAL,
    stream INTEGER NOT NULL DEFAULT 0,
    events INTEGER NOT NULL DEFAULT 0,
    UNIQUE (tenant, key)
);
CREATE INDEX IF NOT EXISTS payonce_records_expiry ON payonce_records (expires_at);
CREATE TABLE IF NOT EXISTS payonce_events (
    tenant TEXT NOT NULL,
    key TEXT NOT NULL,
    seq INTEGER NOT NULL,
    data BLOB NOT NULL,
    span INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (tenant, key, seq)
) WITHOUT ROWID;
"""
# A row of payonce_events is a batch of a stream's events (store/batches.py): seq
# is the number of its last event, span how many it holds (1 in rows of schema 2).
_ADD_SPAN = "ALTER TABLE payonce_events ADD COLUMN span INTEGER NOT NULL DEFAULT 1"
# Schema 1 (before streaming) lacks the stream columns; the events table is
# created by _SCHEMA itself.
_MIGRATE_FROM_1 = """
ALTER TABLE payonce_records ADD COLUMN stream INTEGER NOT NULL DEFAULT 0;
ALTER TABLE payonce_records ADD COLUMN events INTEGER NOT NULL DEFAULT 0;
"""
# Set by a follower in another process that waits on a stream's record: its
# writer, which finds it with watched_runs, then writes every 50 ms, not now and then.
_ADD_WATCHED = "ALTER TABLE payonce_records ADD COLUMN watched INTEGER NOT NULL DEFAULT 0"
_WATCH = (
    "UPDATE payonce_records SET watched = 1 WHERE tenant = ? AND key = ? AND token = ?"
    " AND state = 'in_progress' AND watched = 0"
)
_WATCHED_AT_ONCE = 500
# How many marks a process remembers having made (one per run it followed).
_MARKS_KEPT = 10_000
# A record's event count is read from its events (the last one's number: they are
# numbered from 1, and a new holder's stream starts after the old one's are
# deleted), not kept in payonce_records.events: updating the record beside every
# append wrote a second B-tree page per stream event (benchmarks/NOTEBOOK.md, "Stream
# events without the record's update"). The column stays for files of earlier
# versions, which still write it; none reads it.
_COLUMNS = (
    "tenant, key, fingerprint, state, token, created_at, lease_expires_at, expires_at,"
    " completed_at, status, headers, body, replays, usage, cost_usd, stream,"
    " (SELECT IFNULL(MAX(e.seq), 0) FROM payonce_events AS e"
    " WHERE e.tenant = payonce_records.tenant AND e.key = payonce_records.key)"
)
# Insert a new claim, or take over a record that expired or whose holder's
# lease ran out (same fingerprint only: a different request must get 422). A
# record whose lease is live has not expired, whatever its expires_at (one an
# earlier version wrote: its renewals did not push the expiry): Record.expired.
_CLAIM = """
INSERT INTO payonce_records
    (tenant, key, fingerprint, state, token, created_at, lease_expires_at, expires_at)
VALUES (?1, ?2, ?3, 'in_progress', ?4, ?5, ?6, ?7)
ON CONFLICT (tenant, key) DO UPDATE SET
    fingerprint = excluded.fingerprint, state = 'in_progress', token = excluded.token,
    created_at = excluded.created_at, lease_expires_at = excluded.lease_expires_at,
    expires_at = excluded.expires_at, completed_at = NULL, status = NULL, headers = NULL,
    body = NULL, replays = 0, usage = NULL, cost_usd = NULL, stream = 0, events = 0,
    watched = 0
WHERE (payonce_records.expires_at <= ?5
       AND NOT (payonce_records.state = 'in_progress' AND payonce_records.lease_expires_at > ?5))
   OR (payonce_records.state = 'in_progress' AND payonce_records.lease_expires_at <= ?5
       AND payonce_records.fingerprint = excluded.fingerprint)
RETURNING token
"""
# A holder of this version always has expires_at past its live lease (renew),
# so the expiry alone says whether its record is still there to write.
_HELD = "tenant = ? AND key = ? AND token = ? AND state = 'in_progress' AND expires_at > ?"
# Not expired (Record.expired), with ?3 the time: reads see a running call's record.
_LIVE = "(expires_at > ?3 OR (state = 'in_progress' AND lease_expires_at > ?3))"
# One purge chunk: the oldest expired records by the expiry index (which orders
# ties by rowid, so both statements of a chunk, run back to back in one
# transaction, pick the same rows), their events first. A running call's record
# (its lease live) is never purged, whatever its expires_at.
_EXPIRED = (
    "SELECT {} FROM payonce_records WHERE expires_at <= :now"
    " AND NOT (state = 'in_progress' AND lease_expires_at > :now)"
    " ORDER BY expires_at LIMIT :n"
)
_PURGE_EVENTS = (
    "DELETE FROM payonce_events WHERE (tenant, key) IN (" + _EXPIRED.format("tenant, key") + ")"
)
_PURGE_RECORDS = "DELETE FROM payonce_records WHERE rowid IN (" + _EXPIRED.format("rowid") + ")"
# About 3 ms per chunk of this size on this project's machines (2,000 rows: 6 ms).
PURGE_CHUNK = 1000
# Pause between chunks: as long as the chunk took (its transaction and the wait
# for its turn), within these bounds, so the purge takes at most about half of
# the loop and a busy loop slows it down.
_PURGE_PAUSE_MIN, _PURGE_PAUSE_MAX = 0.001, 0.1


def _translate(exc: sqlite3.Error) -> StorageError:
    if "locked" in str(exc) or "busy" in str(exc):
        return StorageTimeout(f"SQLite store busy: {exc}")
    return StorageError(f"SQLite store failed: {exc}")


class SQLiteStore:
    """The :class:`payonce.store.base.Store` protocol on one SQLite file."""

    def __init__(
        self,
        path: str,
        clock: Clock | None = None,
        *,
        busy_timeout: float = 5.0,
        poll_interval: float = 0.25,
        codec: Codec = PLAIN,
    ) -> None:
        """``codec``: the stored form of responses and events (:mod:`.sealing`)."""
        self._clock = clock or SystemClock()
        self._codec = codec
        self._waiters = Waiters()
        self._poll_interval = poll_interval
        self._marked: set[tuple[str, str, str]] = set()  # runs this process marked watched
        self._busy_timeout = busy_timeout
        if path != ":memory:":
            parent = Path(path).expanduser().resolve().parent
            if not parent.is_dir():
                raise ConfigError(f"--store: directory {parent} does not exist")
        try:
            self._db = sqlite3.connect(
                path, isolation_level=None, timeout=busy_timeout, check_same_thread=False
            )
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            self._db.execute("PRAGMA synchronous=NORMAL")
            row = (
                self._db.execute(
                    "SELECT value FROM payonce_meta WHERE name = 'schema_version'"
                ).fetchone()
                if self._has_meta()
                else None
            )
            if row is not None and int(row[0]) == 1:
                self._db.executescript(_MIGRATE_FROM_1)
            self._db.executescript(_SCHEMA)
            self._add_column("payonce_records", "watched", _ADD_WATCHED)
            if row is not None and int(row[0]) < SCHEMA_VERSION:
                self._add_column("payonce_events", "span", _ADD_SPAN)
                self._db.execute(
                    "UPDATE payonce_meta SET value = ? WHERE name = 'schema_version'"
                    " AND CAST(value AS INTEGER) < ?",
                    (str(SCHEMA_VERSION), SCHEMA_VERSION),
                )
                row = (str(SCHEMA_VERSION),)
        except sqlite3.DatabaseError as exc:
            raise ConfigError(
                f"--store: cannot use {path} as a payonce SQLite store: {exc}"
            ) from exc
        if row is None:
            self._db.execute(
                "INSERT OR IGNORE INTO payonce_meta VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
        elif int(row[0]) > SCHEMA_VERSION:
            raise ConfigError(
                f"--store: {path} was written by a newer payonce (schema {row[0]}); upgrade payonce"
            )
        # From here on a lock never blocks the loop: SQLITE_BUSY comes back at
        # once and the statement is retried from a timer (module docstring).
        self._db.execute("PRAGMA busy_timeout = 0")
        hold = threading.Event()
        self._writes = GroupCommit(self._db, _translate, timeout=busy_timeout, hold=hold)
        # Checkpoints (and their disk syncs) run on a thread, never in this
        # connection (:mod:`payonce.store.checkpoint`).
        self._checkpointer: Checkpointer | None = None
        if mode == "wal":
            self._db.execute("PRAGMA wal_autocheckpoint = 0")
            self._db.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}")
            self._checkpointer = Checkpointer(path, hold=hold)
            self._checkpointer.start()

    def _add_column(self, table: str, column: str, statement: str) -> None:
        # Where missing. The watched column came without a new schema version: an
        # earlier payonce on the same file ignores it (its recorders write often
        # anyway); the span column came with schema 3.
        columns = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
        if column in columns:
            return
        try:
            self._db.execute(statement)
        except sqlite3.OperationalError as exc:
            if "duplicate column" not in str(exc):  # another process added it first
                raise

    def _has_meta(self) -> bool:
        return (
            self._db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'payonce_meta'"
            ).fetchone()
            is not None
        )

    def _write(
        self, sql: str, params: Any, *, fetch: bool = False, deferred: bool = False
    ) -> asyncio.Future[Any]:
        # The statement is queued now, in call order, and the caller awaits a plain
        # future: no task per statement (as a coroutine, every write gathered with
        # another was a task of its own, two per stream event; benchmarks/NOTEBOOK.md).
        return self._writes.submit(sql, params, fetch=fetch, deferred=deferred)

    async def _read(self, sql: str, params: Any, *, one: bool) -> Any:
        """The first row (``one``) or all rows of a query; a lock is waited out off the loop."""
        try:
            cursor = self._db.execute(sql, params)
            return cursor.fetchone() if one else cursor.fetchall()
        except sqlite3.Error as exc:
            if not is_busy(exc):
                raise _translate(exc) from exc
        return await self._read_retrying(sql, params, one=one)

    async def _read_retrying(self, sql: str, params: Any, *, one: bool) -> Any:
        deadline = time.monotonic() + self._busy_timeout
        delay = FIRST_RETRY
        while True:
            remaining = deadline - time.monotonic()
            if remaining > 0:
                await asyncio.sleep(min(delay, remaining))
                delay = min(delay * 2, MAX_RETRY)
            try:
                cursor = self._db.execute(sql, params)
                return cursor.fetchone() if one else cursor.fetchall()
            except sqlite3.Error as exc:
                # The try after the deadline is the last one.
                if not is_busy(exc) or remaining <= 0:
                    raise _translate(exc) from exc

    async def claim(
        self, tenant: str, key: str, fingerprint: str, *, lease: float, ttl: float
    ) -> Claim:
        # The insert comes first: a new key is then one statement. Replays are
        # mostly answered from the gateway's replay cache without calling claim.
        now = self._clock.now()
        token = new_token()
        # Numbered, not named, parameters: a tuple binds faster than a dict (?5 is now).
        expires_at = held_expiry(now + lease, lease, now + ttl)
        params = (tenant, key, fingerprint, token, now, now + lease, expires_at)
        if await self._write(_CLAIM, params, fetch=True) is not None:
            record = Record(
                tenant=tenant,
                key=key,
                fingerprint=fingerprint,
                state=RecordState.IN_PROGRESS,
                token=token,
                created_at=now,
                lease_expires_at=now + lease,
                expires_at=expires_at,
            )
            return Claim(ClaimStatus.ACQUIRED, record)
        existing = await self.get(tenant, key)
        if existing is None:  # purged between the two statements: try once more
            return await self.claim(tenant, key, fingerprint, lease=lease, ttl=ttl)
        if existing.fingerprint != fingerprint:
            return Claim(ClaimStatus.MISMATCH, existing)
        if existing.state is RecordState.COMPLETED:
            return Claim(ClaimStatus.COMPLETED, existing)
        return Claim(ClaimStatus.IN_PROGRESS, existing)

    async def renew(self, tenant: str, key: str, token: str, *, lease: float) -> bool:
        now = self._clock.now()
        lease_end = now + lease
        # The expiry only ever moves later here: never inside the new lease.
        changed = await self._write(
            "UPDATE payonce_records SET lease_expires_at = ?, expires_at = MAX(expires_at, ?)"
            f" WHERE {_HELD}",
            (lease_end, held_expiry(lease_end, lease), tenant, key, token, now),
            deferred=True,  # no client waits; a lease outlives its renewal period
        )
        return bool(changed == 1)

    async def complete(
        self,
        tenant: str,
        key: str,
        token: str,
        response: StoredResponse,
        *,
        usage: Mapping[str, int] | None = None,
        cost_usd: float | None = None,
        replays: int = 0,
        ttl: float,
    ) -> bool:
        now = self._clock.now()
        changed = await self._write(
            "UPDATE payonce_records SET state = 'completed', completed_at = ?, expires_at = ?,"
            " status = ?, headers = ?, body = ?, usage = ?, cost_usd = ?, stream = ?,"
            f" replays = replays + ? WHERE {_HELD}",
            (
                now,
                now + ttl,
                response.status,
                *self._codec.response_out(tenant, key, response),
                orjson.dumps(dict(usage)) if usage is not None else None,
                cost_usd,
                int(response.stream),
                replays,
                tenant,
                key,
                token,
                now,
            ),
        )
        if changed == 1:
            self._waiters.notify(f"{tenant}\x00{key}")
            return True
        return False

    async def release(self, tenant: str, key: str, token: str) -> bool:
        # Submitted together, so one transaction: the events go only if the record did.
        deleted = self._write(
            f"DELETE FROM payonce_records WHERE {_HELD}", (tenant, key, token, self._clock.now())
        )
        orphans = self._write(
            "DELETE FROM payonce_events WHERE tenant = ? AND key = ? AND NOT EXISTS"
            " (SELECT 1 FROM payonce_records WHERE tenant = ? AND key = ?)",
            (tenant, key, tenant, key),
        )
        changed, _ = await asyncio.gather(deleted, orphans)
        if changed == 1:
            self._waiters.notify(f"{tenant}\x00{key}")
            return True
        return False

    async def begin_stream(
        self, tenant: str, key: str, token: str, status: int, headers: tuple[tuple[str, str], ...]
    ) -> bool:
        now = self._clock.now()
        held = self._write(
            "UPDATE payonce_records SET status = ?, headers = ?, body = NULL, stream = 1,"
            f" events = 0 WHERE {_HELD}",
            (status, self._codec.headers_out(tenant, key, headers), tenant, key, token, now),
        )
        # A previous holder's events go, but only if this holder's update held.
        cleared = self._write(
            "DELETE FROM payonce_events WHERE tenant = ? AND key = ? AND EXISTS"
            " (SELECT 1 FROM payonce_records WHERE tenant = ? AND key = ? AND token = ?)",
            (tenant, key, tenant, key, token),
        )
        changed, _ = await asyncio.gather(held, cleared)
        return bool(changed == 1)

    async def append_events(
        self, tenant: str, key: str, token: str, first: int, events: Sequence[bytes]
    ) -> Appended:
        now = self._clock.now()
        # One row for the whole batch (store/batches.py), numbered by its last
        # event, and the statement checks the token itself: a writer whose lease
        # passed to another holder must not add to the new holder's stream. Its
        # row count says whether the key was still held. A batch written again
        # (after a failed write) from the same first event, longer, replaces
        # nothing but overlaps: reads skip the events they have (read_events).
        last = first + len(events) - 1
        (data,) = self._codec.events_out(tenant, key, last, [pack(events)])
        inserted = await self._write(
            "INSERT OR REPLACE INTO payonce_events (tenant, key, seq, span, data)"
            f" SELECT ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM payonce_records WHERE {_HELD})",
            (tenant, key, last, len(events), data, tenant, key, token, now),
            deferred=True,  # followers here got the events live; this is for the rest
        )
        if not inserted:
            return Appended.LOST
        self._waiters.notify(f"{tenant}\x00{key}")
        # Never WATCHED: here it would take a read of its own after every write
        # (about 19k instructions of a quiet write's 133k, benchmarks/NOTEBOOK.md),
        # and the writer's probe asks watched_runs every 250 ms anyway.
        return Appended.WRITTEN

    async def watched_runs(self, runs: Collection[tuple[str, str]]) -> set[tuple[str, str]]:
        # By primary key, a tenant's keys at a time, at most _WATCHED_AT_ONCE of
        # them (under SQLite's bound on a statement's parameters; 1,000 keys
        # took 0.6-0.9 ms, benchmarks/NOTEBOOK.md).
        keys_of: dict[str, list[str]] = {}
        for tenant, key in runs:
            keys_of.setdefault(tenant, []).append(key)
        found: set[tuple[str, str]] = set()
        for tenant, keys in keys_of.items():
            for start in range(0, len(keys), _WATCHED_AT_ONCE):
                chunk = keys[start : start + _WATCHED_AT_ONCE]
                rows = await self._read(
                    "SELECT key FROM payonce_records WHERE tenant = ? AND key IN"
                    f" ({', '.join('?' * len(chunk))}) AND watched = 1 AND state = 'in_progress'",
                    (tenant, *chunk),
                    one=False,
                )
                found.update((tenant, key) for (key,) in rows)
                await asyncio.sleep(0)  # a read runs on the loop: 0.3 ms a chunk, then others' turn
        return found

    async def read_events(self, tenant: str, key: str, after: int = 0) -> list[bytes]:
        rows = await self._read(
            "SELECT seq, span, data FROM payonce_events WHERE tenant = ? AND key = ? AND seq > ?"
            " ORDER BY seq",
            (tenant, key, after),
            one=False,
        )
        events: list[bytes] = []
        position = after
        for seq, span, data in rows:
            if seq <= position:
                continue  # an earlier row held these (a batch written again, longer)
            (value,) = self._codec.events_in(tenant, key, seq - 1, [bytes(data)])
            try:
                batch = unpack(value, span)
            except ValueError as exc:
                raise RecordUnreadable(
                    f"the stored stream for Idempotency-Key {key!r} is damaged: {exc}"
                ) from exc
            events.extend(batch[max(0, span - (seq - position)) :])
            position = seq
        return events

    async def add_replays(self, counts: Mapping[tuple[str, str], int], *, batch: str = "") -> None:
        # Submitted together, so the group commit makes them one transaction: one
        # that failed committed nothing, so a batch sent again is new (no names kept).
        updates = [
            self._write(
                "UPDATE payonce_records SET replays = replays + ?"
                " WHERE tenant = ? AND key = ? AND state = 'completed'",
                (count, tenant, key),
            )
            for (tenant, key), count in counts.items()
        ]
        if updates:
            await asyncio.gather(*updates)

    async def get(self, tenant: str, key: str) -> Record | None:
        row = await self._read(
            f"SELECT {_COLUMNS} FROM payonce_records WHERE tenant = ?1 AND key = ?2 AND {_LIVE}",
            (tenant, key, self._clock.now()),
            one=True,
        )
        return record_from_row(row, self._codec) if row is not None else None

    async def wait(self, tenant: str, key: str, timeout: float) -> Record | None:
        # Writers in this process wake us at once; writers in other processes
        # (``serve --workers``) are seen by polling, at most poll_interval late.
        name = f"{tenant}\x00{key}"
        await self._mark_watched(tenant, key)
        return await wait_for_change(
            lambda: self.get(tenant, key),
            lambda step: self._waiters.wait(name, step),
            lambda: self._poll_interval,
            self._clock,
            timeout,
        )

    async def _mark_watched(self, tenant: str, key: str) -> None:
        """Tell a stream's writer, through its record, that a follower waits on it.

        Once per run and process: a follower waits again after every batch it reads.
        """
        record = await self.get(tenant, key)
        if (
            record is None
            or record.state is not RecordState.IN_PROGRESS
            or record.response is None
            or not record.response.stream  # a call that is no stream is written once
        ):
            return
        mark = (tenant, key, record.token)
        if mark in self._marked:
            return
        if len(self._marked) >= _MARKS_KEPT:
            self._marked.clear()
        self._marked.add(mark)
        await self._write(_WATCH, mark)

    async def purge_expired(self, limit: int | None = None) -> int:
        # Chunk by chunk, each through the group commit (so a lock is waited out
        # off the loop, and the chunk's two deletes are one transaction), with a
        # pause in between: a backlog never holds the loop for more than a chunk.
        now = self._clock.now()
        purged = 0
        while limit is None or purged < limit:
            size = PURGE_CHUNK if limit is None else min(PURGE_CHUNK, limit - purged)
            started = time.monotonic()
            params = {"now": now, "n": size}
            events = self._writes.submit(_PURGE_EVENTS, params, fetch=False)
            records = self._writes.submit(_PURGE_RECORDS, params, fetch=False)
            _, deleted = await asyncio.gather(events, records)
            purged += deleted
            if deleted < size:
                break
            took = time.monotonic() - started
            await asyncio.sleep(min(_PURGE_PAUSE_MAX, max(_PURGE_PAUSE_MIN, took)))
        return purged

    async def ping(self) -> None:
        await self._read("SELECT 1", (), one=True)

    async def close(self) -> None:
        # Writes still waiting for another process's lock fail now, not on a closed
        # connection from a timer nobody is left to hear.
        self._writes.close(StorageError("SQLite store closed"))
        if self._checkpointer is not None:
            # Joins the thread: at most one checkpoint's wait, once, at shutdown.
            self._checkpointer.stop()
        self._db.close()
