"""``sqlite:///path.db``: the embedded default. Survives restarts; shared by worker processes.

sqlite3 runs inline on the event loop: each statement here is a few tens of
microseconds, and a thread hand-off (aiosqlite) measured slower per request on
this project's machines (docs/benchmarks.md). WAL mode lets readers proceed while
one writer commits; ``synchronous=NORMAL`` keeps a process crash safe (an OS
crash may lose the last commits, which only means a retry runs again).

Every state change is a single statement, hence atomic across processes too.
Writes submitted in the same event-loop turn share one transaction
(:mod:`payonce.store.group_commit`).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from payonce.clock import Clock, SystemClock
from payonce.errors import ConfigError, StoreTimeout, StoreUnavailable
from payonce.store.base import Claim, ClaimStatus, Record, RecordState, StoredResponse, new_token
from payonce.store.group_commit import GroupCommit
from payonce.store.waiters import Waiters

__all__ = ["SQLiteStore"]

SCHEMA_VERSION = 1
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
    UNIQUE (tenant, key)
);
CREATE INDEX IF NOT EXISTS payonce_records_expiry ON payonce_records (expires_at);
"""
_COLUMNS = (
    "tenant, key, fingerprint, state, token, created_at, lease_expires_at, expires_at,"
    " completed_at, status, headers, body, replays, usage, cost_usd"
)
# Insert a new claim, or take over a record that expired or whose holder's
# lease ran out (same fingerprint only: a different request must get 422).
_CLAIM = """
INSERT INTO payonce_records
    (tenant, key, fingerprint, state, token, created_at, lease_expires_at, expires_at)
VALUES (:tenant, :key, :fingerprint, 'in_progress', :token, :now, :lease_end, :expires_at)
ON CONFLICT (tenant, key) DO UPDATE SET
    fingerprint = excluded.fingerprint, state = 'in_progress', token = excluded.token,
    created_at = excluded.created_at, lease_expires_at = excluded.lease_expires_at,
    expires_at = excluded.expires_at, completed_at = NULL, status = NULL, headers = NULL,
    body = NULL, replays = 0, usage = NULL, cost_usd = NULL
WHERE payonce_records.expires_at <= :now
   OR (payonce_records.state = 'in_progress' AND payonce_records.lease_expires_at <= :now
       AND payonce_records.fingerprint = excluded.fingerprint)
RETURNING token
"""
_HELD = "tenant = ? AND key = ? AND token = ? AND state = 'in_progress' AND expires_at > ?"


def _record(row: tuple[Any, ...]) -> Record:
    (tenant, key, fingerprint, state, token, created_at, lease_end, expires_at, completed_at,
     status, headers, body, replays, usage, cost_usd) = row  # fmt: skip
    response = None
    if status is not None:
        pairs = tuple((str(name), str(value)) for name, value in orjson.loads(headers))
        response = StoredResponse(status=status, headers=pairs, body=bytes(body))
    return Record(
        tenant=tenant,
        key=key,
        fingerprint=fingerprint,
        state=RecordState(state),
        token=token,
        created_at=created_at,
        lease_expires_at=lease_end,
        expires_at=expires_at,
        completed_at=completed_at,
        response=response,
        replays=replays,
        usage=orjson.loads(usage) if usage else None,
        cost_usd=cost_usd,
    )


def _translate(exc: sqlite3.Error) -> StoreUnavailable:
    if "locked" in str(exc) or "busy" in str(exc):
        return StoreTimeout(f"SQLite store busy: {exc}")
    return StoreUnavailable(f"SQLite store failed: {exc}")


class SQLiteStore:
    """The :class:`payonce.store.base.Store` protocol on one SQLite file."""

    def __init__(
        self,
        path: str,
        clock: Clock | None = None,
        *,
        busy_timeout: float = 5.0,
        poll_interval: float = 0.25,
    ) -> None:
        self._clock = clock or SystemClock()
        self._waiters = Waiters()
        self._poll_interval = poll_interval
        if path != ":memory:":
            parent = Path(path).expanduser().resolve().parent
            if not parent.is_dir():
                raise ConfigError(f"--store: directory {parent} does not exist")
        try:
            self._db = sqlite3.connect(
                path, isolation_level=None, timeout=busy_timeout, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            row = self._db.execute(
                "SELECT value FROM payonce_meta WHERE name = 'schema_version'"
            ).fetchone()
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
        self._writes = GroupCommit(self._db, _translate)

    async def _write(self, sql: str, params: Any, *, fetch: bool = False) -> Any:
        return await self._writes.submit(sql, params, fetch=fetch)

    def _run(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        try:
            return self._db.execute(sql, params)
        except sqlite3.Error as exc:
            raise _translate(exc) from exc

    async def claim(
        self, tenant: str, key: str, fingerprint: str, *, lease: float, ttl: float
    ) -> Claim:
        # The insert comes first: a new key is then one statement. Replays are
        # mostly answered from the gateway's replay cache without calling claim.
        now = self._clock.now()
        token = new_token()
        params = {
            "tenant": tenant,
            "key": key,
            "fingerprint": fingerprint,
            "token": token,
            "now": now,
            "lease_end": now + lease,
            "expires_at": now + ttl,
        }
        if await self._write(_CLAIM, params, fetch=True) is not None:
            record = Record(
                tenant=tenant,
                key=key,
                fingerprint=fingerprint,
                state=RecordState.IN_PROGRESS,
                token=token,
                created_at=now,
                lease_expires_at=now + lease,
                expires_at=now + ttl,
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
        changed = await self._write(
            f"UPDATE payonce_records SET lease_expires_at = ? WHERE {_HELD}",
            (now + lease, tenant, key, token, now),
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
    ) -> bool:
        now = self._clock.now()
        changed = await self._write(
            "UPDATE payonce_records SET state = 'completed', completed_at = ?,"
            " status = ?, headers = ?, body = ?, usage = ?, cost_usd = ?,"
            f" replays = replays + ? WHERE {_HELD}",
            (
                now,
                response.status,
                orjson.dumps(response.headers),
                response.body,
                orjson.dumps(dict(usage)) if usage is not None else None,
                cost_usd,
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
        changed = await self._write(
            f"DELETE FROM payonce_records WHERE {_HELD}", (tenant, key, token, self._clock.now())
        )
        if changed == 1:
            self._waiters.notify(f"{tenant}\x00{key}")
            return True
        return False

    async def add_replays(self, counts: Mapping[tuple[str, str], int]) -> None:
        # Submitted together, so the group commit makes them one transaction.
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
        row = self._run(
            f"SELECT {_COLUMNS} FROM payonce_records"
            " WHERE tenant = ? AND key = ? AND expires_at > ?",
            (tenant, key, self._clock.now()),
        ).fetchone()
        return _record(row) if row is not None else None

    async def wait(self, tenant: str, key: str, timeout: float) -> Record | None:
        # Writers in this process wake us at once; writers in other processes
        # (``serve --workers``) are seen by polling, at most poll_interval late.
        deadline = time.monotonic() + timeout
        while True:
            record = await self.get(tenant, key)
            if record is None or record.state is RecordState.COMPLETED:
                return record
            now = self._clock.now()
            if record.lease_expires_at <= now:
                return record
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return record
            step = min(remaining, self._poll_interval, record.lease_expires_at - now)
            await self._waiters.wait(f"{tenant}\x00{key}", step)
            await asyncio.sleep(0)

    async def purge_expired(self) -> int:
        cursor = self._run(
            "DELETE FROM payonce_records WHERE expires_at <= ?", (self._clock.now(),)
        )
        return cursor.rowcount

    async def ping(self) -> None:
        self._run("SELECT 1").fetchone()

    async def close(self) -> None:
        self._db.close()
