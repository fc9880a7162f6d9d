"""The PostgreSQL schema and its migrations, applied once however many replicas start.

Each migration is one version's statements, applied in one transaction with
the version it brings, under a transaction-scoped advisory lock: two replicas
starting together queue on the lock, and the second finds the work done. A
gateway started with ``--no-migrate`` (the schema applied out of band by
``payonce migrate``) only checks the version. A schema newer than this payonce
knows is refused with one line: an older gateway must not write records whose
meaning changed.

Times are seconds since the epoch (``double precision``) from the gateway's
clock, as in the other stores: a lease is judged by the clock that granted it.
"""

from __future__ import annotations

from typing import Any

from payonce.errors import ConfigError

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "check", "migrate"]

# pg_advisory_xact_lock's key: "payonce" in ASCII, as one bigint.
_LOCK = 0x7061796F6E6365

MIGRATIONS: tuple[tuple[int, str], ...] = (
    (
        1,
        """
        CREATE TABLE payonce_meta (name text PRIMARY KEY, value text NOT NULL);
        CREATE TABLE payonce_records (
            tenant text NOT NULL,
            key text NOT NULL,
            fingerprint text NOT NULL,
            state text NOT NULL CHECK (state IN ('in_progress', 'completed')),
            token text NOT NULL,
            created_at double precision NOT NULL,
            lease_expires_at double precision NOT NULL,
            expires_at double precision NOT NULL,
            completed_at double precision,
            status integer,
            headers bytea,
            body bytea,
            replays bigint NOT NULL DEFAULT 0,
            usage jsonb,
            cost_usd double precision,
            stream boolean NOT NULL DEFAULT false,
            PRIMARY KEY (tenant, key)
        );
        CREATE INDEX payonce_records_expiry ON payonce_records (expires_at);
        CREATE TABLE payonce_events (
            tenant text NOT NULL,
            key text NOT NULL,
            seq integer NOT NULL,
            data bytea NOT NULL,
            PRIMARY KEY (tenant, key, seq)
        );
        -- Replay counts sent under a batch name are added once (Store.add_replays).
        CREATE TABLE payonce_replay_batches (
            name text PRIMARY KEY,
            created_at double precision NOT NULL
        );
        """,
    ),
    (
        2,
        # A follower in another process marks the record it waits for: only the
        # writes to a watched record send a NOTIFY (notify.py).
        "ALTER TABLE payonce_records ADD COLUMN watched boolean NOT NULL DEFAULT false",
    ),
)
SCHEMA_VERSION = MIGRATIONS[-1][0]


async def _version(connection: Any) -> int:
    exists = await connection.fetchval("SELECT to_regclass('payonce_meta') IS NOT NULL")
    if not exists:
        return 0
    value = await connection.fetchval(
        "SELECT value FROM payonce_meta WHERE name = 'schema_version'"
    )
    return int(value) if value is not None else 0


def _newer(version: int, where: str) -> ConfigError:
    return ConfigError(
        f"--store: {where} has schema {version}, newer than this payonce's"
        f" ({SCHEMA_VERSION}); upgrade payonce"
    )


async def migrate(connection: Any, where: str) -> list[int]:
    """Bring the schema to :data:`SCHEMA_VERSION`; the versions this call applied."""
    applied: list[int] = []
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock($1)", _LOCK)
        version = await _version(connection)
        if version > SCHEMA_VERSION:
            raise _newer(version, where)
        for number, statements in MIGRATIONS:
            if number <= version:
                continue
            await connection.execute(statements)
            await connection.execute(
                "INSERT INTO payonce_meta VALUES ('schema_version', $1)"
                " ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                str(number),
            )
            applied.append(number)
    return applied


async def check(connection: Any, where: str) -> None:
    """Refuse a schema that is missing, older or newer than this payonce's."""
    version = await _version(connection)
    if version > SCHEMA_VERSION:
        raise _newer(version, where)
    if version < SCHEMA_VERSION:
        raise ConfigError(
            f"--store: {where} has schema {version}, this payonce needs {SCHEMA_VERSION};"
            " run `payonce migrate --store URL` (or start without --no-migrate)"
        )
