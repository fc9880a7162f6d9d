"""``postgresql://``: records in PostgreSQL, durable across replicas, restarts and crashes.

Every state change is one statement (data-modifying CTEs where a change has
two parts), so it is atomic without a transaction block of our own, and one
round trip. Fencing is the claim's token, checked by every later write in its
``WHERE``; a write meeting a concurrent takeover of its row waits for it and
re-checks the token on the new version (PostgreSQL's read-committed
re-evaluation), and an append locks its record ``FOR SHARE`` so a takeover
cannot slip between the check and the insert. A claim is ``INSERT … ON
CONFLICT DO UPDATE … WHERE`` on the primary key: one winner, however many
replicas race.

Bounded: a pool of ``pool`` connections per process (a request waiting for
one longer than ``timeout`` is answered 503), and on the server
``statement_timeout`` and ``lock_timeout`` of ``timeout`` (a row locked by an
operator's open transaction is a 503, never a hang). Errors become
:class:`StorageError` here; a connection lost (a restart, ``pg_terminate_backend``)
is dropped by the pool and the next call connects again.

Followers: :mod:`payonce.store.postgres.notify`. Expired records are purged
in chunks of ``PURGE_CHUNK`` rows (``FOR UPDATE SKIP LOCKED``: never waiting
for a row a claim is taking), with a pause between chunks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from typing import Any, NamedTuple

import asyncpg
import orjson

from payonce.clock import Clock, SystemClock
from payonce.errors import ConfigError, StorageError, StorageTimeout
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
from payonce.store.postgres import schema
from payonce.store.postgres.batch import StatementBatcher
from payonce.store.postgres.notify import CHANNEL, Notifier
from payonce.store.postgres.url import PASSWORD_ENV, PostgresURL, parse_postgres_url
from payonce.store.rows import record_from_row
from payonce.store.sealing import PLAIN, Codec
from payonce.store.waiters import wait_for_change

__all__ = ["PURGE_CHUNK", "PostgresStore"]

log = logging.getLogger("payonce.store")


async def _keep_session(connection: Any) -> None:
    """The pool's reset between two uses of a connection: nothing to undo.

    asyncpg's default sends ``SELECT pg_advisory_unlock_all(); CLOSE ALL;
    UNLISTEN *; RESET ALL`` on every release: a second round trip for each of
    our one-statement uses (measured: the keyed first call's gateway CPU 1,154 µs
    with it). Nothing here leaves session state behind: the only advisory lock is
    transaction-scoped (schema.py), ``LISTEN`` has a connection of its own outside
    the pool (notify.py), no cursor outlives its statement and no ``SET`` is sent
    (settings are startup parameters). asyncpg still rolls back an open
    transaction before calling this.
    """
    del connection


_COLUMNS = (
    "r.tenant, r.key, r.fingerprint, r.state, r.token, r.created_at, r.lease_expires_at,"
    " r.expires_at, r.completed_at, r.status, r.headers, r.body, r.replays, r.usage,"
    " r.cost_usd, r.stream,"
    " (SELECT COALESCE(MAX(e.seq), 0) FROM payonce_events AS e"
    " WHERE e.tenant = r.tenant AND e.key = r.key)"
)
# Held by token $3 at time $4, for records ($1, $2) aliased r.
_HELD = (
    "r.tenant = $1 AND r.key = $2 AND r.token = $3 AND r.state = 'in_progress'"
    " AND r.expires_at > $4"
)
# A record not expired at $3 (Record.expired): reads see a running call's record.
_LIVE = "(r.expires_at > $3 OR (r.state = 'in_progress' AND r.lease_expires_at > $3))"
# A new key, or a takeover of an expired record or of a lapsed lease (same
# fingerprint only). A claim that loses reads the record in a statement of its
# own: this one's snapshot predates a concurrent winner it waited for.
# Claims go in batches (batch.py): one row per claim, each with its own time
# (excluded.created_at); the rows returned are the claims won.
_CLAIM = """
INSERT INTO payonce_records AS r
    (tenant, key, fingerprint, state, token, created_at, lease_expires_at, expires_at)
SELECT u.tenant, u.key, u.fingerprint, 'in_progress', u.token, u.now, u.lease_end, u.expires_at
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::float8[], $6::float8[],
            $7::float8[]) AS u(tenant, key, fingerprint, token, now, lease_end, expires_at)
ON CONFLICT (tenant, key) DO UPDATE SET
    fingerprint = excluded.fingerprint, state = 'in_progress', token = excluded.token,
    created_at = excluded.created_at, lease_expires_at = excluded.lease_expires_at,
    expires_at = excluded.expires_at, completed_at = NULL, status = NULL,
    headers = NULL, body = NULL, replays = 0, usage = NULL, cost_usd = NULL,
    stream = false, watched = false
WHERE (r.expires_at <= excluded.created_at
       AND NOT (r.state = 'in_progress' AND r.lease_expires_at > excluded.created_at))
   OR (r.state = 'in_progress' AND r.lease_expires_at <= excluded.created_at
       AND r.fingerprint = excluded.fingerprint)
RETURNING r.tenant, r.key
"""
# Renewals go in batches too (5,000 calls in flight renew 500 leases a second with
# the default --lease; one statement each was most of PostgreSQL's CPU per call in
# workload 4); the rows returned are the leases renewed.
_RENEW = """
UPDATE payonce_records AS r SET lease_expires_at = u.lease_end,
    expires_at = GREATEST(r.expires_at, u.expires_at)
FROM unnest($1::text[], $2::text[], $3::text[], $4::float8[], $5::float8[], $6::float8[])
    AS u(tenant, key, token, now, lease_end, expires_at)
WHERE r.tenant = u.tenant AND r.key = u.key AND r.token = u.token
  AND r.state = 'in_progress' AND r.expires_at > u.now
RETURNING r.tenant, r.key
"""
# Completions go in batches too; the rows returned are those still held.
_COMPLETE = """
UPDATE payonce_records AS r SET state = 'completed', completed_at = u.now,
    expires_at = u.expires_at, status = u.status, headers = u.headers, body = u.body,
    usage = u.usage::jsonb, cost_usd = u.cost_usd, stream = u.stream,
    replays = r.replays + u.replays
FROM unnest($1::text[], $2::text[], $3::text[], $4::float8[], $5::float8[], $6::integer[],
            $7::bytea[], $8::bytea[], $9::text[], $10::float8[], $11::boolean[], $12::bigint[])
    AS u(tenant, key, token, now, expires_at, status, headers, body, usage, cost_usd, stream,
         replays)
WHERE r.tenant = u.tenant AND r.key = u.key AND r.token = u.token
  AND r.state = 'in_progress' AND r.expires_at > u.now
RETURNING r.tenant, r.key, r.watched
"""
_RELEASE = f"""
WITH gone AS (
    DELETE FROM payonce_records AS r WHERE {_HELD} RETURNING r.tenant, r.key, r.watched
),
events AS (
    DELETE FROM payonce_events AS e USING gone
    WHERE e.tenant = gone.tenant AND e.key = gone.key
)
SELECT count(*), COALESCE(bool_or(gone.watched), false) FROM gone
"""
_BEGIN_STREAM = f"""
WITH held AS (
    UPDATE payonce_records AS r SET status = $5, headers = $6, body = NULL, stream = true
    WHERE {_HELD} RETURNING r.tenant, r.key, r.watched
),
cleared AS (
    DELETE FROM payonce_events AS e USING held
    WHERE e.tenant = held.tenant AND e.key = held.key
)
SELECT count(*), COALESCE(bool_or(held.watched), false) FROM held
"""
# The writers of quiet streams ask which of them a follower elsewhere marked
# (store.Store.watched_runs), all at once, by primary key.
_WATCHED_RUNS = """
SELECT r.tenant, r.key FROM unnest($1::text[], $2::text[]) AS asked (tenant, key)
JOIN payonce_records AS r ON r.tenant = asked.tenant AND r.key = asked.key
WHERE r.watched AND r.state = 'in_progress'
"""
_APPEND = f"""
WITH held AS (SELECT r.watched FROM payonce_records AS r WHERE {_HELD} FOR SHARE),
added AS (
    INSERT INTO payonce_events (tenant, key, seq, data)
    SELECT $1, $2, u.seq, u.data FROM unnest($5::integer[], $6::bytea[]) AS u(seq, data)
    WHERE EXISTS (SELECT 1 FROM held)
    ON CONFLICT (tenant, key, seq) DO UPDATE SET data = excluded.data
    RETURNING 1
)
SELECT (SELECT count(*) FROM added), COALESCE((SELECT bool_or(watched) FROM held), false)
"""
# A follower's mark (before it reads the record): a write that commits after it
# sees it, and one in flight holds the row, so the read that follows sees that.
_WATCH = (
    "UPDATE payonce_records AS r SET watched = true WHERE r.tenant = $1 AND r.key = $2"
    " AND r.state = 'in_progress' AND NOT r.watched"
)
# Named batches are added once; "" is no name (always added).
_ADD_REPLAYS = """
WITH batch AS (
    INSERT INTO payonce_replay_batches (name, created_at)
    SELECT $4, $5 WHERE $4 <> ''
    ON CONFLICT (name) DO NOTHING
    RETURNING 1
)
UPDATE payonce_records AS r SET replays = r.replays + u.n
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS u(tenant, key, n)
WHERE r.tenant = u.tenant AND r.key = u.key AND r.state = 'completed'
  AND ($4 = '' OR EXISTS (SELECT 1 FROM batch))
"""
_GET = f"SELECT {_COLUMNS} FROM payonce_records AS r WHERE r.tenant = $1 AND r.key = $2 AND {_LIVE}"
_READ_EVENTS = (
    "SELECT data FROM payonce_events WHERE tenant = $1 AND key = $2 AND seq > $3 ORDER BY seq"
)
# One chunk of the purge: the oldest expired records not locked by anyone, their events.
_PURGE = """
WITH doomed AS (
    SELECT tenant, key FROM payonce_records
    WHERE expires_at <= $1 AND NOT (state = 'in_progress' AND lease_expires_at > $1)
    ORDER BY expires_at LIMIT $2
    FOR UPDATE SKIP LOCKED
),
events AS (
    DELETE FROM payonce_events AS e USING doomed AS d
    WHERE e.tenant = d.tenant AND e.key = d.key
)
DELETE FROM payonce_records AS r USING doomed AS d
WHERE r.tenant = d.tenant AND r.key = d.key
"""
# Replay batch names are kept a day: a caller sends a failed batch again within seconds.
_PURGE_BATCHES = "DELETE FROM payonce_replay_batches WHERE created_at < $1"
_BATCH_NAMES_KEPT = 86400.0
PURGE_CHUNK = 1000
_PURGE_PAUSE_MIN, _PURGE_PAUSE_MAX = 0.001, 0.1

# What a lost or refused connection raises (asyncpg's own, and the socket's).
_CONNECTION_ERRORS = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
)
_TIMEOUTS = (
    TimeoutError,
    asyncpg.QueryCanceledError,  # statement_timeout
    asyncpg.LockNotAvailableError,  # lock_timeout
)


class _ClaimRow(NamedTuple):
    tenant: str
    key: str
    fingerprint: str
    token: str
    now: float
    lease_end: float
    expires_at: float


class _RenewRow(NamedTuple):
    tenant: str
    key: str
    token: str
    now: float
    lease_end: float
    expires_at: float


class _CompleteRow(NamedTuple):
    tenant: str
    key: str
    token: str
    now: float
    expires_at: float
    status: int
    headers: bytes
    body: bytes
    usage: str | None
    cost_usd: float | None
    stream: bool
    replays: int

    def size(self) -> int:
        return len(self.body) + len(self.headers)


def _record(row: _ClaimRow | _RenewRow | _CompleteRow) -> tuple[str, str]:
    return row.tenant, row.key


def _columns(rows: Sequence[tuple[Any, ...]], width: int) -> list[list[Any]]:
    """One array per column: the statement's ``unnest`` parameters."""
    if not rows:
        return [[] for _ in range(width)]
    return [list(column) for column in zip(*rows, strict=True)]


def _changed(
    rows: Sequence[_ClaimRow | _RenewRow | _CompleteRow], returned: Sequence[Any]
) -> list[bool]:
    """Which rows the statement wrote, from the (tenant, key) pairs it returned."""
    written = {(row[0], row[1]) for row in returned}
    return [(row.tenant, row.key) in written for row in rows]


def _deadlock(exc: BaseException) -> bool:
    return isinstance(exc.__cause__, asyncpg.DeadlockDetectedError)


def _count(status: str) -> int:
    """The row count of a command tag: ``UPDATE 1``, ``INSERT 0 5``, ``DELETE 0``."""
    return int(status.rsplit(" ", 1)[-1])


class PostgresStore:
    """The :class:`payonce.store.base.Store` protocol on a PostgreSQL database."""

    def __init__(
        self,
        url: str | PostgresURL,
        clock: Clock | None = None,
        *,
        codec: Codec = PLAIN,
        migrate: bool = True,
        poll_interval: float | None = None,
    ) -> None:
        """Nothing connects here: the pool opens on first use (``migrate``: apply the
        schema then, under an advisory lock; otherwise only check its version).
        ``poll_interval``: a waiter looks this often even when notifications work
        (for tests on a manual clock, whose jumps only a look can see)."""
        self._url = parse_postgres_url(url) if isinstance(url, str) else url
        self._clock = clock or SystemClock()
        self._codec = codec
        self._migrate = migrate
        self._pool: asyncpg.Pool | None = None
        self._opening = asyncio.Lock()
        self._applied: list[int] = []  # the migrations this store applied when it opened
        self._notifier = Notifier(
            self._send_notify,
            self._connect_listener if self._url.listen else None,
            poll_interval,
        )
        self._claims: StatementBatcher[_ClaimRow, bool] = StatementBatcher(
            self._claim_rows, record=_record, retry_if=_deadlock, orphaned=self._orphan_claim
        )
        self._renewals: StatementBatcher[_RenewRow, bool] = StatementBatcher(
            self._renew_rows, record=_record, retry_if=_deadlock
        )
        self._completions: StatementBatcher[_CompleteRow, tuple[bool, bool]] = StatementBatcher(
            self._complete_rows, record=_record, size=_CompleteRow.size, retry_if=_deadlock
        )
        self._releasing: set[asyncio.Task[bool]] = set()

    # -- connections ---------------------------------------------------------

    def _options(self) -> dict[str, Any]:
        milliseconds = str(int(self._url.timeout * 1000))
        # asyncpg cancels a statement that outlives command_timeout; the server's own
        # timeouts also end one whose client went away.
        options: dict[str, Any] = {
            "timeout": self._url.timeout,  # connecting
            "command_timeout": self._url.timeout,
            "server_settings": {
                "application_name": "payonce",
                "statement_timeout": milliseconds,
                "lock_timeout": milliseconds,
            },
        }
        if not self._url.prepared:
            # A pooler in transaction mode: no named prepared statements, and no
            # session settings (PgBouncer refuses unknown startup parameters, and
            # a SET would reach whichever server connection it ran on).
            options["statement_cache_size"] = 0
            options["server_settings"] = {"application_name": "payonce"}
        password = os.environ.get(PASSWORD_ENV)
        if password:
            options["password"] = password
        return options

    async def _connect_listener(self) -> Any:
        return await asyncpg.connect(self._url.dsn, **self._options())

    async def _open(self) -> asyncpg.Pool:
        async with self._opening:
            if self._pool is not None:
                return self._pool
            try:
                pool = await asyncpg.create_pool(
                    self._url.dsn,
                    min_size=1,
                    max_size=self._url.pool,
                    reset=_keep_session,
                    **self._options(),
                )
            except ConfigError:
                raise
            except asyncpg.InvalidPasswordError as exc:
                raise StorageError(f"PostgreSQL at {self._url.where}: {exc}") from exc
            except (*_CONNECTION_ERRORS, *_TIMEOUTS, asyncpg.PostgresError) as exc:
                raise StorageError(f"PostgreSQL at {self._url.where} failed: {exc}") from exc
            try:
                async with pool.acquire() as connection:
                    if self._migrate:
                        self._applied = await schema.migrate(connection, self._url.where)
                    else:
                        await schema.check(connection, self._url.where)
            except BaseException:
                await pool.close()
                raise
            self._pool = pool
            self._notifier.start()
            return pool

    async def prepare(self) -> list[int]:
        """Connect, and migrate (or check) the schema now; the versions applied."""
        await self._open()
        return list(self._applied)

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Any]:
        pool = self._pool or await self._open()
        try:
            async with pool.acquire(timeout=self._url.timeout) as connection:
                yield connection
        except ConfigError:
            raise
        except _TIMEOUTS as exc:
            raise StorageTimeout(
                f"PostgreSQL at {self._url.where} did not answer in {self._url.timeout:g} s"
                f" ({type(exc).__name__}: {exc})"
            ) from exc
        except (*_CONNECTION_ERRORS, asyncpg.PostgresError) as exc:
            raise StorageError(f"PostgreSQL at {self._url.where} failed: {exc}") from exc

    async def _execute(self, sql: str, *args: Any) -> str:
        async with self._connection() as connection:
            status: str = await connection.execute(sql, *args)
            return status

    async def _fetch(self, sql: str, *args: Any) -> list[Any]:
        async with self._connection() as connection:
            return list(await connection.fetch(sql, *args))

    async def _fetchrow(self, sql: str, *args: Any) -> Any:
        async with self._connection() as connection:
            return await connection.fetchrow(sql, *args)

    async def _claim_rows(self, rows: Sequence[_ClaimRow]) -> list[bool]:
        won = await self._fetch(_CLAIM, *_columns(rows, 7))
        return _changed(rows, won)

    async def _renew_rows(self, rows: Sequence[_RenewRow]) -> list[bool]:
        renewed = await self._fetch(_RENEW, *_columns(rows, 6))
        return _changed(rows, renewed)

    async def _complete_rows(self, rows: Sequence[_CompleteRow]) -> list[tuple[bool, bool]]:
        """Per row: completed, and watched by a follower elsewhere."""
        done = {
            (row[0], row[1]): row[2] for row in await self._fetch(_COMPLETE, *_columns(rows, 12))
        }
        return [
            ((row.tenant, row.key) in done, done.get((row.tenant, row.key), False)) for row in rows
        ]

    def _orphan_claim(self, row: _ClaimRow, won: bool) -> None:
        """A claim won for a caller that was cancelled: released now, not at lease end."""
        if not won:
            return
        task = asyncio.get_running_loop().create_task(self._release_quietly(row))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _release_quietly(self, row: _ClaimRow) -> bool:
        try:
            return await self.release(row.tenant, row.key, row.token)
        except StorageError as exc:  # its lease lapses instead
            log.info("could not release a claim whose caller left: %s", exc)
            return False

    async def _send_notify(self, payload: str) -> None:
        await self._execute("SELECT pg_notify($1, $2)", CHANNEL, payload)

    # -- the protocol --------------------------------------------------------

    async def claim(
        self, tenant: str, key: str, fingerprint: str, *, lease: float, ttl: float
    ) -> Claim:
        for _ in range(3):
            now = self._clock.now()
            token = new_token()
            expires_at = held_expiry(now + lease, lease, now + ttl)
            won = await self._claims.submit(
                _ClaimRow(tenant, key, fingerprint, token, now, now + lease, expires_at)
            )
            if won:
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
            if existing is None:  # purged between the two statements: try again
                continue
            if existing.fingerprint != fingerprint:
                return Claim(ClaimStatus.MISMATCH, existing)
            if existing.state is RecordState.COMPLETED:
                return Claim(ClaimStatus.COMPLETED, existing)
            return Claim(ClaimStatus.IN_PROGRESS, existing)
        raise StorageError(f"PostgreSQL at {self._url.where}: the claim kept racing a purge")

    async def renew(self, tenant: str, key: str, token: str, *, lease: float) -> bool:
        now = self._clock.now()
        lease_end = now + lease
        row = _RenewRow(tenant, key, token, now, lease_end, held_expiry(lease_end, lease))
        return await self._renewals.submit(row)

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
        headers, body = self._codec.response_out(tenant, key, response)
        row = _CompleteRow(
            tenant,
            key,
            token,
            now,
            now + ttl,
            response.status,
            headers,
            body,
            orjson.dumps(dict(usage)).decode() if usage is not None else None,
            cost_usd,
            response.stream,
            replays,
        )
        done, watched = await self._completions.submit(row)
        if done:
            self._notifier.changed(tenant, key, others=watched)
        return done

    async def release(self, tenant: str, key: str, token: str) -> bool:
        row = await self._fetchrow(_RELEASE, tenant, key, token, self._clock.now())
        if row[0] == 1:
            self._notifier.changed(tenant, key, others=row[1])
            return True
        return False

    async def begin_stream(
        self, tenant: str, key: str, token: str, status: int, headers: tuple[tuple[str, str], ...]
    ) -> bool:
        stored = self._codec.headers_out(tenant, key, headers)
        row = await self._fetchrow(
            _BEGIN_STREAM, tenant, key, token, self._clock.now(), status, stored
        )
        if row[0] == 1:
            self._notifier.changed(tenant, key, others=row[1])
            return True
        return False

    async def append_events(
        self, tenant: str, key: str, token: str, first: int, events: Sequence[bytes]
    ) -> Appended:
        if not events:
            return Appended.WRITTEN if await self._held(tenant, key, token) else Appended.LOST
        data = list(self._codec.events_out(tenant, key, first, events))
        numbers = list(range(first, first + len(data)))
        row = await self._fetchrow(_APPEND, tenant, key, token, self._clock.now(), numbers, data)
        if row[0] > 0:
            self._notifier.changed(tenant, key, others=row[1])
            return Appended.WATCHED if row[1] else Appended.WRITTEN
        return Appended.LOST

    async def watched_runs(self, runs: Collection[tuple[str, str]]) -> set[tuple[str, str]]:
        if not runs:
            return set()
        tenants, keys = zip(*runs, strict=True)
        rows = await self._fetch(_WATCHED_RUNS, list(tenants), list(keys))
        return {(row[0], row[1]) for row in rows}

    async def _held(self, tenant: str, key: str, token: str) -> bool:
        row = await self._fetchrow(
            f"SELECT 1 FROM payonce_records AS r WHERE {_HELD}",
            tenant,
            key,
            token,
            self._clock.now(),
        )
        return row is not None

    async def read_events(self, tenant: str, key: str, after: int = 0) -> list[bytes]:
        rows = await self._fetch(_READ_EVENTS, tenant, key, after)
        return self._codec.events_in(tenant, key, after, [bytes(row[0]) for row in rows])

    async def add_replays(self, counts: Mapping[tuple[str, str], int], *, batch: str = "") -> None:
        if not counts:
            return
        tenants = [tenant for tenant, _ in counts]
        keys = [key for _, key in counts]
        await self._execute(
            _ADD_REPLAYS, tenants, keys, list(counts.values()), batch, self._clock.now()
        )

    async def get(self, tenant: str, key: str) -> Record | None:
        row = await self._fetchrow(_GET, tenant, key, self._clock.now())
        return record_from_row(row, self._codec) if row is not None else None

    async def wait(self, tenant: str, key: str, timeout: float) -> Record | None:
        # Writers in this process wake us at once, those in other processes
        # through NOTIFY (notify.py says when a look is due anyway).
        notifier = self._notifier
        # Marked even while the listener is down: it may be back before the write.
        await self._execute(_WATCH, tenant, key)
        return await wait_for_change(
            lambda: self.get(tenant, key),
            lambda step: notifier.wait(tenant, key, step),
            lambda: notifier.poll_interval,
            self._clock,
            timeout,
        )

    async def purge_expired(self, limit: int | None = None) -> int:
        now = self._clock.now()
        await self._execute(_PURGE_BATCHES, now - _BATCH_NAMES_KEPT)
        purged = 0
        while limit is None or purged < limit:
            size = PURGE_CHUNK if limit is None else min(PURGE_CHUNK, limit - purged)
            started = time.monotonic()
            deleted = _count(await self._execute(_PURGE, now, size))
            purged += deleted
            if deleted < size:
                break
            took = time.monotonic() - started
            await asyncio.sleep(min(_PURGE_PAUSE_MAX, max(_PURGE_PAUSE_MIN, took)))
        return purged

    async def ping(self) -> None:
        await self._fetchrow("SELECT 1")

    async def close(self) -> None:
        await self._claims.close()
        await self._renewals.close()
        await self._completions.close()
        await self._notifier.close()
        if self._pool is not None:
            pool, self._pool = self._pool, None
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pool.close(), timeout=self._url.timeout)
